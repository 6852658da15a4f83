"""The server: `create_app` (`factory`) builds one around a trace file; who may connect (`security`),
the socket namespaces on one base (`namespaces`), the `/ui` pushes (`notifier`) and what the server
holds (`state`)."""

from gradscape.app.server.factory import GradscapeApp, GradscapeDash, create_app
from gradscape.app.server.security import LOOPBACK, ServerConfig, resolve_token
from gradscape.app.server.state import DebugState, ServerState

__all__ = ["LOOPBACK", "DebugState", "GradscapeApp", "GradscapeDash", "ServerConfig", "ServerState", "create_app",
           "resolve_token"]
