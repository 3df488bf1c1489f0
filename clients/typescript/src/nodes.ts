// Which node to connect to next, and after what delay: the socket-free part of failover.

/**
 * Round robin over the node URLs with the backoff applied per full round: after a loss
 * (or a failed connect) the client tries the next node at once (a little jitter aside),
 * and waits the exponential backoff only once every node has failed in a row. A dead
 * node thus costs one quick try, not a wait; with one URL this is exactly the old
 * behaviour (a backoff before every reconnection).
 */
export class NodeRotation {
  private readonly urls: readonly string[];
  private idx = 0;
  /** Failures since the last good connection, in the current round (0..urls.length). */
  private failsInRound = 0;
  /** Full rounds failed since the last good connection: the backoff's exponent. */
  private rounds = 0;

  constructor(
    urls: string | readonly string[],
    private readonly initialDelayMs: number,
    private readonly maxDelayMs: number,
    private readonly random: () => number = Math.random,
  ) {
    const list = typeof urls === "string" ? [urls] : [...urls];
    if (list.length === 0) throw new TypeError("`url` needs at least one node URL");
    for (const url of list) {
      if (typeof url !== "string" || url === "") throw new TypeError(`not a node URL: ${String(url)}`);
    }
    this.urls = list;
  }

  /** The URL of the node in use (or being tried). */
  get current(): string {
    return this.urls[this.idx]!;
  }

  /** Every node URL, in rotation order. */
  get all(): readonly string[] {
    return this.urls;
  }

  /** Full rounds failed since the last good connection. */
  get failedRounds(): number {
    return this.rounds;
  }

  /**
   * The node in use failed (lost, refused, or unusable): moves to the next one and
   * returns the delay in ms before connecting to it. Within a round the delay is a
   * jitter below `initialDelayMs / 2` (so the clients of a dead node do not all land at
   * once); ending a round it is the backoff: half to all of
   * `min(maxDelayMs, initialDelayMs * 2^rounds)`.
   */
  fail(): number {
    this.idx = (this.idx + 1) % this.urls.length;
    this.failsInRound += 1;
    if (this.failsInRound < this.urls.length) return this.random() * (this.initialDelayMs / 2);
    this.failsInRound = 0;
    const ceiling = Math.min(this.maxDelayMs, this.initialDelayMs * 2 ** Math.min(this.rounds, 30));
    this.rounds += 1;
    return ceiling / 2 + this.random() * (ceiling / 2);
  }

  /** The node in use took the connection (handshake done): the next failure starts a fresh round. */
  succeeded(): void {
    this.failsInRound = 0;
    this.rounds = 0;
  }
}
