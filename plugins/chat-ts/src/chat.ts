// chat: posts a line to a chat channel for every event.
//
// It speaks the two common incoming-message dialects over https:
//
// - `format = "slack"` (default): Slack's `chat.postMessage` (`{"channel", "text"}`), and any
//   service that accepts the same JSON (Mattermost, Rocket.Chat, ...). Slack answers 200 even
//   when it refuses a message, with `{"ok": false, "error": "..."}`: that is read too (any
//   other 2xx answer, JSON or not, is a success).
// - `format = "discord"`: a Discord webhook (`{"content"}`; the channel is the webhook's own).
//
// The URL comes from the config; the token never enters the plugin: hookd adds it to every
// request for the listed host (`[plugins.chat.credentials]`), from its own environment.
//
// Which channel: the event body's `channel` (or `event.channel`, as in Slack's Events API),
// else the config's `channel`. Messages posted by a bot, and edits and deletions (a Slack
// message event with `bot_id`, or subtype `bot_message`, `message_changed`, `message_deleted`),
// are passed over: relaying them back into a
// channel the bot posts to would answer its own messages forever.
//
// It keeps no plugin state. A handler that reads a key other deliveries write (a count per
// channel, say) runs again when its commit conflicts, and its requests are sent again: chat
// services do not honour `Idempotency-Key`, so that would post the message twice.
//
// The event's text is untrusted: mentions in it (`@everyone`, `<!channel>`) are not let
// through, and the whole message is cut to what the service takes (Discord: 2000 characters).
import { HandleError, type Event, config, defineHandler, http, log, output } from "@hookd/plugin-sdk";

/** The parts of an event body this handler looks at (all optional). */
interface Body {
  channel?: unknown;
  text?: unknown;
  event?: { channel?: unknown; text?: unknown; bot_id?: unknown; subtype?: unknown };
}

/** Slack message subtypes that are no one's new message (a file shared or a thread reply
 * sent to the channel are, and are posted). */
const PASSED_OVER = new Set(["bot_message", "message_changed", "message_deleted"]);

/** Slack's `{"ok": false}` errors that say the fault is Slack's, for now. */
const SLACK_TRANSIENT = new Set(["internal_error", "fatal_error", "service_unavailable", "request_timeout"]);

/** The longest message each format posts, in characters (Discord refuses more than 2000). */
const MAX_CHARS = { slack: 4000, discord: 2000 } as const;

export const handler = defineHandler((event) => {
  const url = config.require("url");
  const format = config.get("format") ?? "slack";
  if (format !== "slack" && format !== "discord") {
    throw HandleError.permanent(`format must be "slack" or "discord", not ${JSON.stringify(format)}`);
  }
  const body = readBody(event);
  const subtype = body.event?.subtype;
  if (body.event?.bot_id !== undefined || (typeof subtype === "string" && PASSED_OVER.has(subtype))) {
    log.info(`passed over ${event.eventId}: a bot's message, or an edit or deletion`);
    return output.json({ skipped: "bot message, edit or deletion" });
  }
  const channel = str(body.channel) ?? str(body.event?.channel) ?? config.get("channel");
  if (channel === undefined) {
    throw HandleError.permanent("no channel: the event has none and `channel` is not set in the config");
  }

  const text = message(event, body, MAX_CHARS[format], format === "slack" ? slackEscaped : (c) => c);
  const payload = format === "slack" ? { channel, text } : { content: text, allowed_mentions: { parse: [] } };
  // A refused host or a 4xx is permanent (fix the config, then replay); a transport error,
  // a timeout, 5xx, 408 or 429 is a retry, no sooner than the service's Retry-After.
  const response = http.post(url).json(payload).timeout(10_000).send().errorForStatus();

  if (format === "slack") {
    // Slack answers JSON; compatible services may answer a plain `ok`, which is a success too.
    const answer = slackAnswer(response.body);
    if (answer.ok === false) {
      const why = `the chat service refused the message: ${answer.error ?? "no reason given"}`;
      // Slack's own rate limit arrives as a 200 with `ratelimited`: worth waiting for.
      if (answer.error === "ratelimited") throw HandleError.retry(why, 30_000);
      // Slack's own troubles pass; anything else (an unknown channel, a bad token) is ours.
      if (answer.error !== undefined && SLACK_TRANSIENT.has(answer.error)) throw HandleError.retry(why);
      throw HandleError.permanent(why);
    }
  }
  log.info(`posted ${event.eventId} to ${channel}`);
  return output.json({ channel });
});

/** One character as Slack must get it, so `<!channel>` or `<@U1>` in an event's text is shown,
 * not acted on (Slack's formatting rules: `&`, `<` and `>` escaped). */
function slackEscaped(c: string): string {
  return c === "&" ? "&amp;" : c === "<" ? "&lt;" : c === ">" ? "&gt;" : c;
}

function slackAnswer(body: Uint8Array): { ok?: boolean; error?: string } {
  try {
    const parsed = JSON.parse(new TextDecoder().decode(body));
    return parsed !== null && typeof parsed === "object" ? parsed : {};
  } catch {
    return {};
  }
}

function readBody(event: Event): Body {
  if (event.body.length === 0) return {};
  const parsed = event.json<unknown>();
  return parsed !== null && typeof parsed === "object" && !Array.isArray(parsed) ? (parsed as Body) : {};
}

function str(v: unknown): string | undefined {
  return typeof v === "string" && v.trim() !== "" ? v : undefined;
}

/** One line: what arrived, and its own text when the event carries one, each character as
 * `escaped` gives it; `max` characters at most once escaped, cut with an ellipsis between two
 * characters (never inside an escape). */
function message(event: Event, body: Body, max: number, escaped: (c: string) => string): string {
  const said = str(body.text) ?? str(body.event?.text);
  const head = `${event.eventType} from ${event.source} (${event.eventId})`;
  const units = Array.from(said === undefined ? head : `${head}: ${said}`, escaped);
  const length = (u: string) => Array.from(u).length;
  if (units.reduce((n, u) => n + length(u), 0) <= max) return units.join("");
  let kept = "";
  let n = 0;
  for (const unit of units) {
    if (n + length(unit) > max - 1) break;
    kept += unit;
    n += length(unit);
  }
  return `${kept}…`;
}
