"""The composition root: wires several services together in one process (the
embedded default, ``harnessrl run``, ``harnessrl trial run``) and holds the
``harnessrl`` CLI (``stack.cli``). Services and the common package never
import this package or each other; they meet here through their gRPC/HTTP
clients on 127.0.0.1."""
