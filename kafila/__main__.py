from kafila.cli import run_process

run_process()
