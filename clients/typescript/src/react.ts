// `@ordo/client/react`: a React hook over LiveList. React is an optional peer
// dependency; the main entry (and the browser bundle) never import this file.

import { useCallback, useEffect, useRef, useState, useSyncExternalStore } from "react";

import { OrdoClient, type ListEnded, type LiveList, type OrdoClientOptions } from "./client.js";
import type { OrdoError } from "./errors.js";
import type { Item, SubscribeOptions } from "./types.js";

/** What `useLiveList` returns; a new object only when something in it changed. */
export interface LiveListState {
  /** The window's items (empty until the first frame). */
  items: readonly Item[];
  /** The first frame arrived. */
  ready: boolean;
  /** The last error reported for the list (a refused subscribe, a refused change, a gap), or null. */
  error: OrdoError | null;
  /** The number of items in the whole view (for "130 rooms" or a scroll bar), or null before the server said. */
  total: number | null;
  /** The last write (batch `seq`) the items reflect, or null before the first frame. */
  writeSeq: number | null;
  /** Why the server ended the subscription (a collection dropped, a field removed), or null. Not re-subscribed. */
  ended: ListEnded | null;
  /** The list itself (for `setRange`, say), or null before the effect subscribed. */
  list: LiveList | null;
}

const NO_ITEMS: readonly Item[] = Object.freeze([]);
const IDLE: LiveListState = Object.freeze({
  items: NO_ITEMS,
  ready: false,
  error: null,
  total: null,
  writeSeq: null,
  ended: null,
  list: null,
});

/**
 * An `OrdoClient` owned by the component: made at mount (and when `url` changes),
 * closed at unmount. `token` and `tokenProvider` pass through to it and are read
 * at every authentication, so new ones need no new connection: a changed `token`
 * is sent at once on the live connection (a refresh). They must stay for the same
 * user; for another one, remount (a React `key`). Null options: no client.
 */
export function useOrdoClient(options: OrdoClientOptions | null | undefined): OrdoClient | null {
  const latest = useRef(options);
  latest.current = options;
  const [client, setClient] = useState<OrdoClient | null>(null);
  const url = options?.url ?? null;
  const hasToken = options ? options.token !== undefined || options.tokenProvider !== undefined : false;

  useEffect(() => {
    const current = latest.current;
    if (!current || url === null) return undefined;
    const { token: _token, tokenProvider: _provider, ...rest } = current;
    const made = new OrdoClient({
      ...rest,
      // Read at each `auth`: the props of the last render.
      ...(hasToken
        ? {
            tokenProvider: async () => {
              const now = latest.current;
              if (now?.tokenProvider) return now.tokenProvider();
              if (now?.token !== undefined) return now.token;
              throw new Error("no token or tokenProvider any more");
            },
          }
        : {}),
    });
    setClient(made);
    return () => {
      made.close();
      setClient((shown) => (shown === made ? null : shown));
    };
  }, [url, hasToken]);

  const token = options?.token;
  useEffect(() => {
    if (client && token !== undefined) client.refreshToken();
  }, [client, token]);

  return client;
}

function isClient(value: OrdoClient | OrdoClientOptions): value is OrdoClient {
  return typeof (value as Partial<OrdoClient>).subscribe === "function";
}

/**
 * Subscribes to a window for as long as the component is mounted and returns its
 * contents. A change of `collection`, `fields`, `payload` or `id` subscribes anew;
 * a change of `filter`/`sort` becomes a `set_view` and of `offset`/`limit` a
 * `set_range`, so the list moves by diffs. Pass a null client or view to hold off.
 *
 * `client` is an `OrdoClient`, or the options of one the hook makes and owns
 * (`{ url, token }` or `{ url, tokenProvider }`, see `useOrdoClient`).
 */
export function useLiveList(
  clientOrOptions: OrdoClient | OrdoClientOptions | null | undefined,
  view: SubscribeOptions | null | undefined,
): LiveListState {
  const owned = useOrdoClient(clientOrOptions && !isClient(clientOrOptions) ? clientOrOptions : null);
  const client = clientOrOptions && isClient(clientOrOptions) ? clientOrOptions : owned;
  const identity = view
    ? JSON.stringify([view.collection, view.fields ?? null, view.payload ?? null, view.id ?? null])
    : null;
  const viewKey = view ? JSON.stringify([view.filter ?? null, view.sort ?? []]) : null;
  const rangeKey = view ? `${view.offset ?? 0}:${view.limit}` : null;

  const latest = useRef(view);
  latest.current = view;
  const [list, setList] = useState<LiveList | null>(null);

  useEffect(() => {
    const current = latest.current;
    if (!client || !current || client.state === "closed") return undefined;
    const subscribed = client.subscribe(current);
    setList(subscribed);
    return () => {
      subscribed.close();
      setList((shown) => (shown === subscribed ? null : shown));
    };
  }, [client, identity]);

  useEffect(() => {
    const current = latest.current;
    if (!list || !current) return;
    list.setView({ filter: current.filter ?? null, sort: current.sort ?? [] });
    list.setRange(current.offset ?? 0, current.limit);
  }, [list, viewKey, rangeKey]);

  const subscribe = useCallback(
    (notify: () => void) => {
      if (!list) return () => {};
      const offChange = list.on("change", notify);
      const offError = list.on("error", notify);
      const offEnded = list.on("ended", notify);
      return () => {
        offChange();
        offError();
        offEnded();
      };
    },
    [list],
  );

  const cache = useRef<LiveListState>(IDLE);
  const getSnapshot = useCallback((): LiveListState => {
    if (!list) return IDLE;
    const previous = cache.current;
    const ready = list.seq > 0;
    if (
      previous.list === list &&
      previous.items === list.items &&
      previous.ready === ready &&
      previous.error === list.error &&
      previous.total === list.total &&
      previous.writeSeq === list.writeSeq &&
      previous.ended === list.ended
    ) {
      return previous;
    }
    const next: LiveListState = {
      items: list.items,
      ready,
      error: list.error,
      total: list.total,
      writeSeq: list.writeSeq,
      ended: list.ended,
      list,
    };
    cache.current = next;
    return next;
  }, [list]);

  return useSyncExternalStore(subscribe, getSnapshot, getSnapshot);
}
