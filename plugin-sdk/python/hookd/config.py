"""The plugin instance's configuration: the `config` table of its `[plugins.<name>]` section
in `hookd.toml`.

    [plugins.score]
    config = { labels = "bug,feature,other" }
"""

from . import _host
from ._errors import Permanent


def get(key, default=None):
    """The configured value of `key` (a str), or `default` if it is not set."""
    value = _host.config_get(key)
    return default if value is None else value


def require(key):
    """The configured value of `key`; raises `Permanent` naming the key if it is not set (a
    retry would read the same configuration: fix it, then replay)."""
    value = _host.config_get(key)
    if value is None:
        raise Permanent("config key `%s` is not set" % key)
    return value
