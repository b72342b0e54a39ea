"""The front door on a deployed stage: an API Gateway Lambda authorizer (issue 11.7).

With ``KVCM_GATEWAY_AUTHORIZER`` set in the stage's environment (Chalice loads the app
with it when it packages or deploys), every ``/api/<method>`` route is deployed behind
this TOKEN authorizer: a request without valid credentials is answered 401 by API
Gateway and never reaches (or wakes) the API function. API Gateway caches a verdict per
token for ``TTL_S``, so a revoked key or deleted account may pass the gateway that much
longer; the handler's own check (roles, scopes, revocation within the config refresh)
runs on every call regardless, so the cache never widens what a key may do.

The local stack and the tests leave it off and rely on that in-handler check alone.
"""

from __future__ import annotations

from chalice import AuthResponse, Blueprint
from chalice.app import AuthRequest

from ..protocol.errors import UnauthorizedError
from ..runtime import Runtime, get_runtime
from ..settings import Settings

#: Whether the API routes are deployed behind the authorizer (read when the app loads).
ENABLED = Settings.from_env().gateway_authorizer
#: How long API Gateway may reuse a verdict for the same token.
TTL_S = 30

blueprint = Blueprint(__name__)


class GatewayUnauthorized(Exception):
    """What a TOKEN authorizer raises for API Gateway to answer 401 (the message is the contract)."""

    def __init__(self) -> None:
        super().__init__("Unauthorized")


def verdict(runtime: Runtime, token: str) -> AuthResponse:
    """Allow every route to a caller whose bearer token authenticates, naming it as the
    principal; anything else is 401 at the gateway."""
    try:
        principal = runtime.auth.authenticate({"Authorization": token or ""})
    except UnauthorizedError:
        raise GatewayUnauthorized() from None
    return AuthResponse(routes=["*"], principal_id=principal.label, context={"role": principal.role.name})


@blueprint.authorizer(ttl_seconds=TTL_S, name="kvcm_api_key")
def api_key_authorizer(auth_request: AuthRequest) -> AuthResponse:
    return verdict(get_runtime(), auth_request.token)
