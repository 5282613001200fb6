"""The core: what a node holds and does, as values and behaviour on an
injected clock. It never touches a socket, never reads the wall clock and
never imports the reactor or any layer above it; every engine enters it
through ``service.Service`` (its own publishes, and another origin's log
through ``Service.follow``). The map of the package: README, "Code".
"""
