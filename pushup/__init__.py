"""PushUp: a long-polling publish/subscribe service on Twisted.

Publishers ``POST /publish`` to named channels; subscribers hold
``GET /subscribe?channels=...&since=<cursor>`` open and are answered the
moment a matching message is published, each message exactly once per
client however its polls and publishes are spread over the cluster.

Modules, pure core first: ``errors``, ``model``, ``cursor``, ``store``,
``hub``, ``config``, ``metrics`` (no I/O); then ``service`` (behaviour over an
injected clock), ``web`` (HTTP in), ``node`` (composition) and ``cli``.
Run ``pushup serve --help`` for every setting.
"""

__version__ = "0.1.0"
