"""A trial's run, over one backend: the runner and its phases (``runner``, ``state``), the
verify phase (``verify``), multi-step preparation (``step_setup``), running a task's
healthcheck (``healthcheck``), collecting its artifacts (``artifacts``), the trial's
lifecycle and termination reasons (``lifecycle``) and its clients of the proxy and the
capture store (``endpoints``).

It imports the task format (``task/``), the defences, the backend interface
(``backends/base.py``) and the harness adapters, never a backend's implementation by name
(``factory.py`` above it chooses one) and never the service above it.
"""
