// chat: posts a line to a chat channel for every event, and counts the events per channel.
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
// else the config's `channel`. The count lives in plugin state under `count/<channel>`, and
// is committed only when the message was accepted: a failed post leaves no trace, and the
// retry counts the event once.
import { HandleError, type Event, config, defineHandler, http, log, output, state } from "@hookd/plugin-sdk";

/** The parts of an event body this handler looks at (all optional). */
interface Body {
  channel?: unknown;
  text?: unknown;
  event?: { channel?: unknown; text?: unknown };
}

export const handler = defineHandler((event) => {
  const url = config.require("url");
  const format = config.get("format") ?? "slack";
  if (format !== "slack" && format !== "discord") {
    throw HandleError.permanent(`format must be "slack" or "discord", not ${JSON.stringify(format)}`);
  }
  const body = readBody(event);
  const channel = str(body.channel) ?? str(body.event?.channel) ?? config.get("channel");
  if (channel === undefined) {
    throw HandleError.permanent("no channel: the event has none and `channel` is not set in the config");
  }

  // Reads see committed state; this write is kept only if the attempt succeeds.
  const key = `count/${channel}`;
  const count = (state.getJson<number>(key) ?? 0) + 1;
  state.setJson(key, count);

  const text = message(event, body, count);
  const payload = format === "slack" ? { channel, text } : { content: text };
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
      throw HandleError.permanent(why);
    }
  }
  log.info(`posted ${event.eventId} to ${channel} (message ${count} there)`);
  return output.json({ channel, count });
});

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

/** One line: what arrived, and its own text when the event carries one. */
function message(event: Event, body: Body, count: number): string {
  const said = str(body.text) ?? str(body.event?.text);
  const head = `${event.eventType} from ${event.source} (${event.eventId}), #${count} here`;
  return said === undefined ? head : `${head}: ${said.slice(0, 2000)}`;
}
