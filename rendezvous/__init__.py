"""The rendezvous role: session registry, NAT probe responder, signalling, blind relay."""
