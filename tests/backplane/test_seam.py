"""pushup/backplane/__init__.py: the seam's one TCP dialler, as every engine uses it."""

from __future__ import annotations

import pytest
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.task import Clock

from pushup.backplane import client_endpoint


@pytest.mark.parametrize(("host", "kind"), [("127.0.0.1", TCP4ClientEndpoint),
                                            ("::1", TCP6ClientEndpoint),
                                            ("localhost", HostnameEndpoint)])
def test_an_ip_literal_is_dialled_directly_and_a_name_resolved(host, kind):
    """A literal needs no resolver thread and no staggered attempts: a refused
    connection to 127.0.0.1 is reported at once."""
    assert type(client_endpoint(Clock(), host, 6379, timeout=3)) is kind
