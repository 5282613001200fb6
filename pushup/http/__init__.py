"""The HTTP front: ``protocol`` turns bytes into request values and response
values into bytes (the only code here that touches a socket; ``incoming``,
``phase``, ``framing`` and ``upgrade`` are its parts as values); the
endpoints (``handlers``) turn request values into the core's calls. It imports the
core, the config and the backplane seam, never an engine, and knows no
engine's paths: an engine's endpoints come through the seam's ``Mount``.
"""
