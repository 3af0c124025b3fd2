"""kvpool.vllm: kvpool as vLLM's KV connector.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvpoolConnector",
        "kv_connector_module_path": "kvpool.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"pool": "kvpool://127.0.0.1:7000"}}'

See kvpool/vllm/connector.py for the extra-config keys and README.md.
Importing this module with a vLLM it was not built for raises ImportError
naming the supported versions (vLLM's connector API changes between minor
releases, and a connector that half-works corrupts outputs).
"""
SUPPORTED_VLLM = ("0.32",)  # minor series whose connector API this module follows


def _check_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError("kvpool.vllm needs vLLM (supported: %s.x): %s"
                          % (", ".join(SUPPORTED_VLLM), e)) from e
    ver = getattr(vllm, "__version__", "unknown")
    series = ".".join(ver.split(".")[:2])
    if series not in SUPPORTED_VLLM:
        raise ImportError("kvpool.vllm supports vLLM %s.x; this is vLLM %s. Install a supported "
                          "vLLM (python/requirements-vllm.txt pins the tested one)"
                          % (", ".join(SUPPORTED_VLLM), ver))
    return ver


VLLM_VERSION = _check_vllm()

from .connector import (KvpoolConnector, KvpoolConnectorMetadata,  # noqa: E402
                        KvpoolConnectorStats, worker_stats)

__all__ = ["KvpoolConnector", "KvpoolConnectorMetadata", "KvpoolConnectorStats", "worker_stats",
           "SUPPORTED_VLLM", "VLLM_VERSION"]
