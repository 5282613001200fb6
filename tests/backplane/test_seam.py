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
    endpoint = client_endpoint(Clock(), host, 6379, timeout=3)
    assert type(endpoint) is kind
    if kind is not HostnameEndpoint:  # a literal: no resolver thread, no staggered attempts
        assert (endpoint._host, endpoint._port, endpoint._timeout) == (host, 6379, 3)
