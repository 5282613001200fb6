"""The test suite. Importing it installs the reactor ``pushup serve --reactor epoll``
runs (pushup/_twisted.py's ``LeanEPollReactor``), before anything imports
``twisted.internet.reactor``: in-process tests that turn a real reactor
(tests/real_reactor.py) turn that one."""

from pushup._twisted import install_lean_epoll

install_lean_epoll()
