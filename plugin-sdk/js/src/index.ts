/**
 * hookd's plugin SDK for TypeScript and JavaScript: write a webhook handler as one function,
 * build it into a `hookd:plugin@0.3.0` component with `build.mjs`.
 *
 * ```ts
 * import { defineHandler, log, output, state } from "@hookd/plugin-sdk";
 *
 * export const handler = defineHandler((event) => {
 *   // Reads see committed state; writes commit only if this attempt succeeds.
 *   const count = (state.getJson<number>("count") ?? 0) + 1;
 *   state.setJson("count", count);
 *   log.info(`${event.eventId} is event number ${count}`);
 *   return output.json({ count });
 * });
 * ```
 */
export { defineHandler, toHandleError, type HandlerExport, type HandlerFn, type Output } from "./handler.js";
export { Event, type EventInit, type Header } from "./event.js";
export { BodyError, HandleError } from "./error.js";
export { HttpError, Response } from "./http-core.js";
export * as config from "./config.js";
export * as http from "./http.js";
export * as log from "./log.js";
export * as output from "./output.js";
export * as state from "./state.js";
