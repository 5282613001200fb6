"""PushUp: a long-polling publish/subscribe service on Twisted.

Publishers ``POST /publish`` to named channels; subscribers hold
``GET /subscribe?channels=...&since=<cursor>`` open and are answered the
moment a matching message is published, each message exactly once per
client however its polls and publishes are spread over the cluster.

The package's folders are its layers, each importing only those beneath it
(``tests/test_layers.py`` checks); each folder's ``__init__`` states its
rule, and the README's "Code" section draws the map.

Run ``pushup serve --help`` for every setting.
"""

from pushup._build import choose

__version__ = "0.1.0"
# "compiled (mypyc, N modules)" or "interpreted (why)": decided before any module
# of the core is imported (pushup/_build.py).
BUILD = choose()
