"""The operator's Kopf handlers, at the module path earlier charts run
(``kopf run -m lookahead_operator.handlers``); they live in :mod:`lookahead_operator.runtime.handlers`."""

from lookahead_operator.runtime.handlers import *  # noqa: F401,F403 - importing registers the handlers with Kopf
