/**
 * An error reported by the server (the codes of PROTOCOL.md "Error codes", such as
 * `invalid_view` or `unknown_collection`) or by the client itself:
 *
 * - `closed`: the client or the list was closed;
 * - `gap`: a frame's `seq` was not the next one (the list is re-subscribed by itself);
 * - `invalid_diffs`: a frame's diffs did not apply to the list (re-subscribed likewise);
 * - `digest_mismatch`: after a frame, the list's window digest was not the server's
 *   (the frame is not applied; re-subscribed likewise);
 * - `protocol`: the server sent something this client cannot read.
 */
export class OrdoError extends Error {
  readonly code: string;
  readonly sub?: string;

  constructor(code: string, message: string, sub?: string) {
    super(message);
    this.name = "OrdoError";
    this.code = code;
    if (sub !== undefined) this.sub = sub;
  }
}
