"""PushUp: a long-polling publish/subscribe service on Twisted.

Publishers ``POST /publish`` to named channels; subscribers hold
``GET /subscribe?channels=...&since=<cursor>`` open and are answered the
moment a matching message is published, each message exactly once per
client however its polls and publishes are spread over the cluster.

The package's folders are its layers; each imports only those beneath it
(``tests/test_layers.py`` checks):

- ``core/``: values, cursor, store, hub and the service, pure and on an
  injected clock; never a socket, never the reactor;
- ``config``: one validated ``Config`` from defaults, file, environment, flags;
- ``http/``: the HTTP front (the httptools protocol) and the endpoints over it;
- ``backplane/``: the seam to the cluster, and its engines: ``disk``,
  ``mesh/`` (peer links) and ``redis/``;
- ``ops/``: the composition root (``node``), ``cli``, ``workers``, figures.

Run ``pushup serve --help`` for every setting.
"""

from pushup._build import choose

__version__ = "0.1.0"
# "compiled (mypyc, N modules)" or "interpreted (why)": decided before any module
# of the core is imported (pushup/_build.py).
BUILD = choose()
