"""The engines the gateway serves from: the interface (``base``) and its
implementations (``local``, ``vllm_pool``, ``scripted``), chosen by name in
``services.gateway.registry``."""
