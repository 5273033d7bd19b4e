"""A second implementation of the Sandbox gRPC contract: a front that keeps its
own trial records and delegates every trial to a remote executor over HTTP."""
