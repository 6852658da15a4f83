"""The server: `create_app` (`factory`) builds one around a trace file, from what it holds and who may connect
(app/serving/: `state` and `security`, re-exported here, and `notifier`) and the socket namespaces on one base
(`namespaces`)."""

from gradscape.app.server.factory import GradscapeApp, GradscapeDash, create_app
from gradscape.app.serving.security import LOOPBACK, ServerConfig, resolve_token
from gradscape.app.serving.state import DebugState, ServerState

__all__ = ["LOOPBACK", "DebugState", "GradscapeApp", "GradscapeDash", "ServerConfig", "ServerState", "create_app",
           "resolve_token"]
