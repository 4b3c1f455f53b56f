"""Joining a Ray cluster (``--address``): before ``ray.init``, a check that the cluster takes
this process's authentication token, so that a refused one is a one-line ScenarioError saying
what to set instead of Ray's 20 s of retries and a bare ConnectionError (``check_join_auth``).
"""

from __future__ import annotations

import os

TOKEN_WHERE = "~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)"


def check_join_auth(address: str, timeout_s: float = 10.0) -> None:
    """Before joining the cluster at ``address``: ask its GCS for the cluster's id as Ray's own
    client will (with the token header Ray's interceptor adds when this process uses token
    authentication); when it answers UNAUTHENTICATED, raise a ScenarioError (exit 2: a setting
    to fix before any run can start) whose one line says what to set. When the cluster asks
    for a token, RAY_AUTH_MODE is unset and a token is at hand (the file a cluster YAML's
    file_mounts copies to ~/.ray/auth_token), token mode is turned on and the token tried, as
    Ray itself does for ``--address auto`` only. Ray itself would
    retry for about 20 s, printing an InvalidAuthToken warning a second, then raise a bare
    ConnectionError (exit 1). Anything else (no answer, an unknown address, a Ray without
    token authentication) is left to ``ray.init`` to report."""
    from raysim.scenario.schema import ScenarioError

    try:
        import grpc
        from ray._private import services
        from ray._private.authentication import authentication_token_setup as setup
        from ray._private.authentication.grpc_authentication_client_interceptor import (
            SyncAuthenticationMetadataClientInterceptor,
        )
        from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return
    try:
        target = services.canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - no cluster there: ray.init says so
        return
    if not target:
        return
    if address == "auto":  # Ray's rule for "auto" (ray.init applies it next): an existing token
        setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)  # turns token mode on

    def refused() -> bool:
        channel = grpc.intercept_channel(grpc.insecure_channel(target), SyncAuthenticationMetadataClientInterceptor())
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s
            )
            return False
        except grpc.RpcError as e:
            return e.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            channel.close()

    if not refused():
        return
    # a cluster that asks for a token, RAY_AUTH_MODE unset and a token at hand: token mode on, as
    # Ray's rule for "auto" does (an explicit address gets no such rule from Ray)
    if get_authentication_mode() != AuthenticationMode.TOKEN and setup.maybe_enable_token_auth_if_token_available(
        warn_if_disabled=False
    ):
        if not refused():
            return
    where = f"--address {address}: the Ray cluster at {target}"
    if get_authentication_mode() != AuthenticationMode.TOKEN and os.environ.get("RAY_AUTH_MODE") is not None:
        raise ScenarioError(
            f"{where} requires token authentication; set RAY_AUTH_MODE=token for raysim too "
            f"(export RAY_AUTH_MODE=token), with the cluster's token in {TOKEN_WHERE}"
        )
    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        raise ScenarioError(
            f"{where} requires token authentication and raysim found no token; put the cluster's token in "
            f"{TOKEN_WHERE} (token mode then turns on by itself)"
        )
    raise ScenarioError(
        f"{where} refused raysim's token (RAY_AUTH_TOKEN, else the file at RAY_AUTH_TOKEN_PATH, "
        f"else ~/.ray/auth_token); give raysim the cluster's token (the head's ~/.ray/auth_token)"
    )
