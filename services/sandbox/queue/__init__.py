"""The trial queue between the gRPC front and the workers: ``base`` (the semantics both keep),
``memory`` (in-process) and ``redis``."""
