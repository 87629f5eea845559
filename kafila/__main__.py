import sys

from kafila.cli import main

sys.exit(main())
