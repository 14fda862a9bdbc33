/**
 * Building a handler's output: the optional string the host stores on the delivery
 * and shows in the admin API (capped, 64 KiB by default: `output_kib`).
 */
import { HandleError } from "./error.js";
import { errorMessage } from "./realm.js";

/** `value` as JSON, as a handler's successful result. */
export function json(value: unknown): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    throw HandleError.permanent(`cannot encode output as JSON: ${errorMessage(e)}`);
  }
  if (text === undefined) {
    throw HandleError.permanent(`cannot encode output as JSON: ${typeof value}`);
  }
  return text;
}
