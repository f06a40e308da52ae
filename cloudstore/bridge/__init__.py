"""The store bridge (``lnk-store-bridge``): proved calls from Link to a store driver.

See ``server.StoreBridge`` for the bridge, ``client.BridgeClient`` for its
callers and ``proof`` for the proof both sides compute.
"""

from .client import BridgeClient, BridgeError, bridge_error_word, exchange, proof_line
from .drivers import Contract
from .limits import Limits
from .proof import compute_proof, read_key_file
from .server import SOCKET_NAME, AgentSpec, StoreBridge

__all__ = [
    "AgentSpec",
    "BridgeClient",
    "BridgeError",
    "bridge_error_word",
    "Contract",
    "Limits",
    "SOCKET_NAME",
    "StoreBridge",
    "compute_proof",
    "exchange",
    "proof_line",
    "read_key_file",
]
