/**
 * The ways a handler attempt can fail, as the host understands them (the Rust SDK's
 * `HandleError`).
 *
 * Throw one from a handler, or let the SDK's own errors propagate: an {@link HttpError} or a
 * {@link BodyError} thrown out of a handler becomes the `HandleError` the Rust SDK's `?` would
 * make of it.
 */
import type { HandleError as WitHandleError } from "hookd:plugin/types@0.3.0";

/** Why a handler attempt did not succeed. */
export class HandleError extends Error {
  /** `retry`: try again later (up to the plugin's `max_attempts`); `permanent`: dead-letter now. */
  readonly kind: "retry" | "permanent";
  /** Why; stored on the attempt and shown by the admin API. */
  readonly reason: string;
  /** For a retry: not before this many milliseconds (the host keeps it within its bounds). */
  readonly afterMs: number | undefined;

  private constructor(kind: "retry" | "permanent", reason: string, afterMs?: number) {
    super(describe(kind, reason, afterMs));
    this.name = "HandleError";
    this.kind = kind;
    this.reason = reason;
    this.afterMs = afterMs;
  }

  /**
   * A failure that may succeed later (a downstream service is unavailable). Without `afterMs`
   * the host retries with exponential backoff and jitter; with it, no sooner than that.
   */
  static retry(reason: string, afterMs?: number): HandleError {
    if (afterMs !== undefined && !(Number.isSafeInteger(afterMs) && afterMs >= 0)) {
      throw new RangeError(`afterMs must be a whole number of milliseconds >= 0, not ${afterMs}`);
    }
    return new HandleError("retry", String(reason), afterMs);
  }

  /** A failure no retry can fix (the event is not one this handler understands). */
  static permanent(reason: string): HandleError {
    return new HandleError("permanent", String(reason));
  }

  /** The WIT `handle-error` value the component returns. */
  toWit(): WitHandleError {
    if (this.kind === "permanent") return { tag: "permanent", val: this.reason };
    return {
      tag: "retry",
      val: {
        reason: this.reason,
        afterMs: this.afterMs === undefined ? undefined : BigInt(this.afterMs),
      },
    };
  }
}

function describe(kind: "retry" | "permanent", reason: string, afterMs?: number): string {
  if (kind === "permanent") return `permanent failure: ${reason}`;
  return afterMs === undefined ? `retry: ${reason}` : `retry after ${afterMs} ms: ${reason}`;
}

/**
 * An event body that is not the text or JSON expected. Thrown out of a handler it is a
 * permanent failure: the same bytes never decode on a retry.
 */
export class BodyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "BodyError";
  }
}
