/** The event a handler gets, with methods to read its body and headers. */
import type { Event as WitEvent, Header } from "hookd:plugin/types@0.3.0";

import { BodyError } from "./error.js";
import { errorMessage, isBytes, kindOf, localBytes } from "./realm.js";

export type { Header };

const decoder = new TextDecoder("utf-8", { fatal: true });

/** What a test (or the SDK) needs to make an {@link Event}; the rest has defaults. */
export interface EventInit {
  source: string;
  eventId: string;
  eventType: string;
  body?: Uint8Array | string;
  orderingKey?: string;
  sequence?: bigint | number;
  attempt?: number;
  receivedAtMs?: bigint | number;
  headers?: Header[];
  stale?: boolean;
}

/**
 * One event, handed to a handler once per delivery attempt (fields as in the WIT `event`:
 * `u64` values are `bigint`).
 */
export class Event implements WitEvent {
  /** The source the event arrived on. */
  readonly source: string;
  /** The provider's event id. */
  readonly eventId: string;
  /** The event's type. */
  readonly eventType: string;
  /** The ordering key, if the parser gave one. */
  readonly orderingKey: string | undefined;
  /** The sequence number, if the parser gave one. */
  readonly sequence: bigint | undefined;
  /** Which attempt this is for this handler, starting at 1 (every attempt, across retries and replays). */
  readonly attempt: number;
  /** When hookd received the event, in milliseconds since the Unix epoch. */
  readonly receivedAtMs: bigint;
  /** The original request headers, names lower-cased. */
  readonly headers: Header[];
  /** The original raw request body (a `Uint8Array` of the handler's realm, whatever realm the bytes came from). */
  readonly body: Uint8Array;
  /** A newer `sequence` of this ordering key was already handled (`on_stale = "deliver"`, or a forced replay). */
  readonly stale: boolean;

  constructor(init: EventInit) {
    this.source = init.source;
    this.eventId = init.eventId;
    this.eventType = init.eventType;
    this.orderingKey = init.orderingKey ?? undefined;
    this.sequence = init.sequence === undefined || init.sequence === null ? undefined : BigInt(init.sequence);
    this.attempt = init.attempt ?? 1;
    this.receivedAtMs = BigInt(init.receivedAtMs ?? 0);
    this.headers = (init.headers ?? []).map((h) => ({ name: h.name.toLowerCase(), value: h.value }));
    // In a component the WIT bindings hand the body in as a Uint8Array of another realm, which
    // `instanceof Uint8Array` (the handler's, a library's) does not recognise: made this realm's
    // here (its prototype set, not a copy).
    const body: unknown = init.body ?? new Uint8Array();
    if (typeof body === "string") this.body = new TextEncoder().encode(body);
    else if (isBytes(body)) this.body = localBytes(body);
    else throw new TypeError(`an event's body is a Uint8Array or a string, not ${kindOf(body)}`);
    this.stale = init.stale ?? false;
  }

  /** The first value of request header `name` (case-insensitive). */
  header(name: string): string | undefined {
    const lower = name.toLowerCase();
    return this.headers.find((h) => h.name === lower)?.value;
  }

  /** The body as UTF-8 text; else a {@link BodyError} (a permanent failure if not caught). */
  text(): string {
    try {
      return decoder.decode(this.body);
    } catch (e) {
      throw new BodyError(`body is not valid UTF-8: ${errorMessage(e)}`);
    }
  }

  /** The body parsed as JSON; else a {@link BodyError} (a permanent failure if not caught). */
  json<T = unknown>(): T {
    const text = this.text();
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new BodyError(`body is not valid JSON: ${errorMessage(e)}`);
    }
  }
}
