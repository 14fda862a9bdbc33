/**
 * The plugin instance's configuration: the `config` table of its `[plugins.<name>]` section
 * in `hookd.toml`.
 *
 * ```toml
 * [plugins.chat]
 * config = { url = "https://hooks.slack.com/services/T000/B000/XXXX" }
 * ```
 */
import { HandleError } from "./error.js";
import { host } from "./host.js";

/** The configured value of `key`, or `undefined` if it is not set. */
export function get(key: string): string | undefined {
  return host().configGet(key);
}

/**
 * The configured value of `key`; a missing one is a permanent error naming the key (no retry
 * can fix a config: fix it, then replay).
 */
export function require(key: string): string {
  const value = get(key);
  if (value === undefined) {
    // The same text as the Python SDK's `config.require`.
    throw HandleError.permanent(`config key \`${key}\` is not set`);
  }
  return value;
}
