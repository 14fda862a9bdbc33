/**
 * Log lines, attributed by the host to the plugin and to the event being handled.
 *
 * The host caps the bytes logged per call (64 KiB by default, `log_kib`) and drops lines
 * beyond that, so log what a person needs to understand a failure, not every step.
 */
import { host } from "./host.js";

/** Severity of a log line. */
export type Level = "debug" | "info" | "warn" | "error";

/** Logs at debug level. */
export function debug(message: string): void {
  host().log("debug", String(message));
}

/** Logs at info level. */
export function info(message: string): void {
  host().log("info", String(message));
}

/** Logs at warn level. */
export function warn(message: string): void {
  host().log("warn", String(message));
}

/** Logs at error level. */
export function error(message: string): void {
  host().log("error", String(message));
}
