"""The load test: Locust users that drive the extender as kube-scheduler does (`locustfile.py`), the arithmetic
of that behaviour (`workload.py`), and the runner that reports and checks a bounded run (`run.py`,
`make loadtest`).

The extender never imports anything from here, and nothing here may import Locust or gevent except
`locustfile.py`, which runs only in Locust's own process: gevent's monkey-patching must never reach the
runner or the test suite.
"""
