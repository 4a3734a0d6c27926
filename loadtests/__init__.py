"""Load tests: benign and attack traffic through the guard with locust, and SLO gates.

``locustfile.py`` is the locust entry point (``locust -f loadtests/locustfile.py``, or
``schedguard load``). Everything else here is plain Python that imports neither locust nor
gevent, so tests and the ``schedguard`` command can use it without monkey-patching:

- :mod:`loadtests.prompts`: benign requests with realistic prompt and output lengths;
- :mod:`loadtests.replay`: the payloads/ corpus as requests to replay;
- :mod:`loadtests.httpclient`: a small HTTP/1.1 client (keep-alive, SSE timing, raw framing);
- :mod:`loadtests.shapes`: load shapes (steady, ramp, spike, attack burst);
- :mod:`loadtests.monitor`: RSS of the guard and the upstream, the guard's ``/metrics``;
- :mod:`loadtests.slo`: the SLO gate and its table;
- :mod:`loadtests.progress`: the run's progress so far, as ``schedguard load`` shows it;
- :mod:`loadtests.target`: the model and upstream kind of a target, from its ``/v1/models``;
- :mod:`loadtests.fit`: which benign look-alikes each upstream kind is sent;
- :mod:`loadtests.timeline`: the run over time (``timeline.json``);
- :mod:`loadtests.report`: ``report.html``, drawn with :mod:`loadtests.svgchart`.

Nothing imports this package except the locustfile and ``schedguard load``.
"""
