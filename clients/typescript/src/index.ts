export { OrdoClient, LiveList } from "./client.js";
export { NodeRotation } from "./nodes.js";
export type { ConnectionState, Failover, ListChange, ListEnded, ListStatus, OrdoClientOptions, ReconnectOptions } from "./client.js";
export { OrdoError } from "./errors.js";
export { applyDiffs } from "./diffs.js";
export { windowDigest, type DigestRow } from "./digest.js";
export { ProtocolState } from "./protocol.js";
export type { EndedReason, ProtocolEvent, SubscriptionPhase, SubscriptionSnapshot } from "./protocol.js";
export { PROTOCOL_VERSION } from "./types.js";
export type {
  AuthExpiredFrame,
  AuthedFrame,
  AuthIdentity,
  AuthOp,
  ClientMessage,
  CompareOp,
  DiffsFrame,
  ErrorFrame,
  FieldValue,
  Filter,
  Item,
  Json,
  ResumedFrame,
  ResumedSub,
  ResumeEntry,
  ResumeOp,
  ServerFrame,
  SetRangeOp,
  SetViewOp,
  SortKey,
  SubscribeOp,
  SubscribeOptions,
  UnsubscribedFrame,
  UnsubscribeOp,
  VectorDiff,
  VectorDiffKind,
  ViewSpec,
  WelcomeAuth,
  WelcomeFrame,
  WindowDefinition,
} from "./types.js";
