// Reading a JWT's claims on the client: only to know when to refresh it. Nothing is
// verified here (the server does that); a token that cannot be read is sent as it is.

function decodeBase64Url(text: string): string {
  const base64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const padded = base64 + "=".repeat((4 - (base64.length % 4)) % 4);
  const binary = atob(padded);
  const bytes = new Uint8Array(binary.length);
  for (let index = 0; index < binary.length; index++) bytes[index] = binary.charCodeAt(index);
  return new TextDecoder().decode(bytes);
}

/** The claims of a JWT (its middle part, base64url JSON), or null if it is not one. */
export function jwtClaims(token: string): Record<string, unknown> | null {
  const parts = token.split(".");
  if (parts.length !== 3 || parts[1] === "") return null;
  try {
    const claims: unknown = JSON.parse(decodeBase64Url(parts[1]!));
    return claims !== null && typeof claims === "object" && !Array.isArray(claims)
      ? (claims as Record<string, unknown>)
      : null;
  } catch {
    return null;
  }
}

/** A JWT's `exp` and `iat` (unix seconds), each null when absent or not a number. */
export function jwtTimes(token: string): { exp: number | null; iat: number | null } {
  const claims = jwtClaims(token);
  const time = (value: unknown) => (typeof value === "number" && Number.isFinite(value) ? value : null);
  return { exp: time(claims?.exp), iat: time(claims?.iat) };
}

/** How long before `exp` to refresh: a fifth of the token's lifetime, at most a minute. */
const MAX_REFRESH_MARGIN_MS = 60_000;
/** A refresh never comes sooner than this after the last one (a provider handing out a stale token must not spin). */
const MIN_REFRESH_DELAY_MS = 1_000;

/**
 * When to ask for a fresh token (ms from `nowMs`): at `exp - min(60 s, lifetime / 5)`,
 * the lifetime being `exp - iat` (or `exp - now` without `iat`). Null without `exp`.
 */
export function refreshDelayMs(exp: number | null, iat: number | null, nowMs: number): number | null {
  if (exp === null) return null;
  const expMs = exp * 1000;
  const lifetimeMs = Math.max(0, expMs - (iat !== null ? iat * 1000 : nowMs));
  const at = expMs - Math.min(MAX_REFRESH_MARGIN_MS, lifetimeMs / 5);
  // setTimeout takes at most 2^31 - 1 ms.
  return Math.min(0x7fff_ffff, Math.max(MIN_REFRESH_DELAY_MS, at - nowMs));
}
