"""getClusterInfo (UPSTREAM_V2 §2.4): leader discovery for upstream's clients.

Every KVCM container serves every method, so "the leader" a client should talk to is the
API itself: the answer names the background-job lease holder as leader (as
getManagerClusterInfo does) and the API's advertised endpoint (``KVCM_ADVERTISED_ENDPOINT``)
as its address. Without an advertised endpoint the answer has no ``leader_endpoint``,
which upstream's client reads as "keep the URL in use" (upstream answers so when it
cannot look the endpoint up).
"""

from __future__ import annotations

from ..clock import Clock, now_us
from ..protocol.errors import NotLeaderError
from ..protocol.models import (
    GetClusterInfoRequest,
    GetClusterInfoResponse,
    GetManagerClusterInfoResponse,
    MetaNodeEndpoint,
    NodeEndpoint,
)
from ..stores.lease import Lease


def advertised_endpoint(endpoint: str, node_id: str) -> MetaNodeEndpoint | None:
    """``host:port`` as a MetaNodeEndpoint (the HTTP port; KVCM has no RPC port), or None."""
    host, colon, port = endpoint.rpartition(":")
    if not endpoint or not colon or not host or not port.isdigit():
        return None
    return MetaNodeEndpoint(node_id=node_id, host=host.strip("[]"), meta_http_port=int(port))


def admin_endpoint(endpoint: str, node_id: str) -> NodeEndpoint | None:
    """The same as a NodeEndpoint (getManagerClusterInfo): the admin methods share the API's port."""
    meta = advertised_endpoint(endpoint, node_id)
    if meta is None:
        return None
    return NodeEndpoint(
        node_id=node_id, host=meta.host, meta_http_port=meta.meta_http_port, admin_http_port=meta.meta_http_port
    )


class ClusterInfo:
    """Leader discovery and the background-job lease as upstream's cluster methods see them."""

    def __init__(self, lease: Lease, advertised_endpoint: str, clock: Clock) -> None:
        self.lease = lease
        self.advertised_endpoint = advertised_endpoint
        self.clock = clock

    def get_cluster_info(self, request: GetClusterInfoRequest) -> GetClusterInfoResponse:
        """Who answers and where the leader is: any node answers, and it is the API itself."""
        leader = self.lease.status().holder or ""
        return GetClusterInfoResponse(
            self_node_id=self.lease.node_id,
            leader_node_id=leader,
            leader_endpoint=advertised_endpoint(self.advertised_endpoint, leader or self.lease.node_id),
        )

    def get_manager_cluster_info(self) -> GetManagerClusterInfoResponse:
        """The lease holder is the "leader"; ``info_updated_time`` is when this was read (µs)."""
        status = self.lease.status()
        return GetManagerClusterInfoResponse(
            self_node_id=self.lease.node_id,
            leader_node_id=status.holder or "",
            self_leader_expiration_time=status.expires_at_us if status.holder == self.lease.node_id else 0,
            info_updated_time=now_us(self.clock),
            leader_endpoint=admin_endpoint(self.advertised_endpoint, status.holder or self.lease.node_id),
        )

    def leader_demote(self) -> None:
        """Release the lease if this node holds it; otherwise SERVER_NOT_LEADER (as upstream)."""
        if not self.lease.release():
            holder = self.lease.holder()
            raise NotLeaderError(
                f"node '{self.lease.node_id}' does not hold the background-job lease "
                f"(holder: {repr(holder) if holder else 'none'})"
            )
