"""getClusterInfo (UPSTREAM_V2 §2.4): leader discovery for upstream's clients.

Every KVCM container serves every method, so "the leader" a client should talk to is the
API itself: the answer names the background-job lease holder as leader (as
getManagerClusterInfo does) and the API's advertised endpoint (``KVCM_ADVERTISED_ENDPOINT``)
as its address. Without an advertised endpoint the answer has no ``leader_endpoint``,
which upstream's client reads as "keep the URL in use" (upstream answers so when it
cannot look the endpoint up).
"""
from __future__ import annotations

from typing import Optional

from ..protocol.models import GetClusterInfoRequest, GetClusterInfoResponse, MetaNodeEndpoint, NodeEndpoint
from ..runtime import Runtime


def advertised_endpoint(endpoint: str, node_id: str) -> Optional[MetaNodeEndpoint]:
    """``host:port`` as a MetaNodeEndpoint (the HTTP port; KVCM has no RPC port), or None."""
    host, colon, port = endpoint.rpartition(":")
    if not endpoint or not colon or not host or not port.isdigit():
        return None
    return MetaNodeEndpoint(node_id=node_id, host=host.strip("[]"), meta_http_port=int(port))


def admin_endpoint(endpoint: str, node_id: str) -> Optional[NodeEndpoint]:
    """The same as a NodeEndpoint (getManagerClusterInfo): the admin methods share the API's port."""
    meta = advertised_endpoint(endpoint, node_id)
    if meta is None:
        return None
    return NodeEndpoint(node_id=node_id, host=meta.host, meta_http_port=meta.meta_http_port,
                        admin_http_port=meta.meta_http_port)


def get_cluster_info(runtime: Runtime, request: GetClusterInfoRequest) -> GetClusterInfoResponse:
    """Who answers and where the leader is: any node answers, and it is the API itself."""
    lease = runtime.lease
    leader = lease.status().holder or ""
    return GetClusterInfoResponse(self_node_id=lease.node_id, leader_node_id=leader,
                                  leader_endpoint=advertised_endpoint(runtime.settings.advertised_endpoint,
                                                                      leader or lease.node_id))
