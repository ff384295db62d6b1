// scopefs as OpenClaw's memory (plain ESM, no dependencies, no build step).
//
// The plugin owns plugins.slots.memory and registers memory_search,
// memory_get and memory_write with memory-core's parameter names and result
// shapes. It speaks only to `scopefs serve --socket PATH` (JSON over HTTP on
// a Unix socket): it never names a principal, a store or a session; it
// passes the ingress facts the gateway verified, and scopefs decides the
// view. What the plugin believes about who is asking comes ONLY from the tool
// context OpenClaw builds (agentId, sessionKey, messageChannel,
// agentAccountId, requesterSenderId, sandboxed), never from tool arguments:
//
//   agent:<a>:<channel>:<account>:direct:<peer>   a direct chat, when the
//       context's channel and account are the key's (and requesterSenderId,
//       if present, is the key's peer)
//   agent:<a>:<channel>:group:<id>  (or :channel:<id>)   a group chat, with
//       the account from agentAccountId and the sender from requesterSenderId
//   anything else (agent:<a>:main, unparseable, mismatched)   no facts: the
//       ambiguous view, never a broader one
//
// requesterSenderId is set only by a channel's own inbound turn (the sender
// its transport vouches for); POST /tools/invoke never sets it (RESEARCH.md
// §3). Two more facts are passed on once scopefs's API declares them (its
// /openapi.json; it refuses a field it does not know): `sandboxed`,
// OpenClaw's classification of the session, which scopefs may use only to
// narrow a view, and `session_key`, the session key itself, which names
// the logical session and never decides a view.
//
// OpenClaw lowercases session keys (and normalizes account ids), so scopefs
// bindings and conversations must be registered with the ids as the keys
// spell them; a group's sender is lowercased the same way. The host's own
// memory runtime (trigger recall, status, doctor) never carries a session
// identity, so it is served the ambiguous view only, and
// authorizeSearchHits fails closed. The pre-compaction memory flush is
// declined (flushPlanResolver returns null): OpenClaw runs it with only
// `read` and an append-only workspace `write`, into a workspace file that
// no scopefs view labels (RESEARCH.md §7). Nothing here logs a query, a
// path or any content.

import { randomBytes } from "node:crypto";
import http from "node:http";

const MAX_READ_LINES = 120; // memory-core's default window; the API bounds characters (12,000) itself
const MAX_RESULTS = 100; // the API's search limit
const DEFAULT_RESULTS = 10;
const MAX_QUERY_CHARS = 1000;
const MAX_PATH_CHARS = 4096;
const MAX_WRITE_CHARS = 1 << 20;
const MAX_FACT_CHARS = 256;
const AGENT_ID = /^[a-z][a-z0-9-]{0,31}$/;
const EXPIRY_MARGIN_US = 30_000_000; // reopen a little before the capability expires
// A capability refused for one of these is reopened once, from the call's own facts: plan-expired,
// invalid-context (another server), session-rebound (its session key now names another subject's session;
// possible only once the API takes session_key).
const REOPEN_REASONS = new Set(["plan-expired", "invalid-context", "session-rebound"]);
const REQUEST_TIMEOUT_MS = 30_000;
const MAX_CACHED_SESSIONS = 1024;
const OPTIONAL_FACTS = ["sandboxed", "session_key"]; // sent only when the API declares them
const MAX_SESSION_KEY_BYTES = 512;

class ToolInputError extends Error {
  constructor(message) {
    super(message);
    this.name = "ToolInputError";
  }
}

class ToolAuthorizationError extends Error {
  constructor(message) {
    super(message);
    this.name = "ToolAuthorizationError";
  }
}

/** A refusal or failure the API answered, with its stable code and (for a denial) reason. */
class ScopefsApiError extends Error {
  constructor(status, error) {
    super(typeof error?.message === "string" ? error.message : "the scopefs request failed");
    this.name = "ScopefsApiError";
    this.status = status;
    this.code = error?.code ?? "failed";
    this.reason = error?.reason;
  }
}

function jsonResult(payload) {
  return { content: [{ type: "text", text: JSON.stringify(payload, null, 2) }], details: payload };
}

// ---------------------------------------------------------------- the API

/** One JSON exchange with the API: its status and parsed answer (a GET sends no body). */
function exchange(socketPath, method, route, body) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers = data === undefined ? {} : { "content-type": "application/json", "content-length": data.length };
    const request = http.request(
      { socketPath, path: route, method, headers, timeout: REQUEST_TIMEOUT_MS },
      (response) => {
        const chunks = [];
        response.on("data", (chunk) => chunks.push(chunk));
        response.on("error", reject);
        response.on("end", () => {
          try {
            resolve({ status: response.statusCode, answer: JSON.parse(Buffer.concat(chunks).toString("utf8")) });
          } catch {
            reject(new ScopefsApiError(response.statusCode, { code: "failed", message: "scopefs answered no JSON" }));
          }
        });
      },
    );
    request.on("timeout", () => request.destroy(new Error("scopefs did not answer in time")));
    request.on("error", (error) =>
      reject(new ScopefsApiError(0, { code: "unavailable", message: `scopefs is unreachable (${error.code ?? "error"})` })),
    );
    request.end(data);
  });
}

async function post(socketPath, route, body) {
  const { status, answer } = await exchange(socketPath, "POST", route, body);
  if (answer && answer.ok === true) return answer.result;
  throw new ScopefsApiError(status, answer?.error);
}

/**
 * The optional facts the API's open declares (its OpenAPI document, public over the socket); none when
 * that cannot be read. The API refuses a field it does not know, so an undeclared fact is left out.
 */
async function declaredOpenFacts(socketPath) {
  try {
    const { status, answer } = await exchange(socketPath, "GET", "/openapi.json");
    const properties = status === 200 ? answer?.components?.schemas?.OpenRequest?.properties : undefined;
    return new Set(OPTIONAL_FACTS.filter((name) => properties != null && Object.hasOwn(properties, name)));
  } catch {
    return new Set();
  }
}

function nonce() {
  return randomBytes(24).toString("base64url"); // 32 characters of [A-Za-z0-9_-]
}

/**
 * Sessions of one scopefs server: capabilities cached per open request (agent and the facts sent),
 * reopened once for REOPEN_REASONS. Which optional facts the API takes is asked again
 * whenever a request is not cached (opens are rare), so a changed API is noticed at the next open.
 */
class Scopefs {
  constructor(socketPath) {
    this.socketPath = socketPath;
    this.sessions = new Map();
    this.declared = new Set();
  }

  request(agent, facts) {
    const body = { agent, ...facts };
    for (const name of OPTIONAL_FACTS) if (!this.declared.has(name)) delete body[name];
    return body;
  }

  cached(key) {
    const session = this.sessions.get(key);
    return session && session.expiresUs - EXPIRY_MARGIN_US > Date.now() * 1000 ? session : undefined;
  }

  async open(agent, facts, fresh = false) {
    let body = this.request(agent, facts);
    let hit = !fresh && this.cached(JSON.stringify(body));
    if (hit) return hit;
    if (OPTIONAL_FACTS.some((name) => name in facts)) {
      this.declared = await declaredOpenFacts(this.socketPath);
      body = this.request(agent, facts);
      hit = !fresh && this.cached(JSON.stringify(body));
      if (hit) return hit;
    }
    const key = JSON.stringify(body);
    this.sessions.delete(key);
    const opened = await post(this.socketPath, "/v1/open", body);
    const session = { key, capability: opened.capability, subject: opened.subject, expiresUs: opened.expires_us };
    if (this.sessions.size >= MAX_CACHED_SESSIONS) this.sessions.delete(this.sessions.keys().next().value);
    this.sessions.set(key, session);
    return session;
  }

  async call(agent, facts, op, args) {
    for (let attempt = 0; ; attempt += 1) {
      const session = await this.open(agent, facts, attempt > 0);
      try {
        return await post(this.socketPath, `/v1/${op}`, {
          capability: session.capability,
          nonce: nonce(),
          ts: Date.now() * 1000,
          args,
        });
      } catch (error) {
        const reopen = error instanceof ScopefsApiError && error.code === "denied" && REOPEN_REASONS.has(error.reason);
        if (!reopen || attempt > 0) throw error;
        this.sessions.delete(session.key);
      }
    }
  }
}

// ---------------------------------------------------------------- identity

function lower(value) {
  return typeof value === "string" ? value.trim().toLowerCase() : "";
}

function fits(...values) {
  return values.every((v) => typeof v === "string" && v.length > 0 && v.length <= MAX_FACT_CHARS);
}

function hasIdentityLinks(cfg) {
  const links = cfg?.session?.identityLinks;
  return links != null && typeof links === "object" && Object.keys(links).length > 0;
}

/**
 * The verified ingress facts of a tool context, for POST /v1/open: {} (the
 * ambiguous view) unless the session key parses and agrees with the rest of
 * the context.
 */
export function identityFacts(ctx, cfg) {
  const key = typeof ctx?.sessionKey === "string" ? ctx.sessionKey : "";
  const parts = key.split(":");
  if (parts.length < 5 || parts[0] !== "agent" || parts[1] !== lower(ctx.agentId)) return {};
  const channel = lower(ctx.messageChannel);
  if (!channel || parts[2] !== channel) return {};
  const account = lower(ctx.agentAccountId);
  const direct = parts.length >= 6 && parts[4] === "direct";
  const group = parts[3] === "group" || parts[3] === "channel";
  if (direct === group) return {}; // neither, or both readings (an account named "group"): not one subject
  const senderId = typeof ctx.requesterSenderId === "string" ? ctx.requesterSenderId.trim() : "";
  if (direct) {
    const peer = parts.slice(5).join(":");
    if (parts[3] !== account || !fits(channel, account, peer)) return {};
    if (hasIdentityLinks(cfg)) return {}; // the key's peer may be a linked name, not the sender
    if (senderId && senderId.toLowerCase() !== peer) return {};
    return { chat: "direct", channel, account, sender: peer };
  }
  const conversation = parts.slice(4).join(":");
  if (!fits(channel, account, conversation)) return {};
  const facts = { chat: "group", channel, account, conversation };
  // the group message's sender, spelled as OpenClaw spells a DM key's peer: one binding serves both
  if (senderId && fits(senderId)) facts.sender = senderId.toLowerCase();
  return facts;
}

/** Everything POST /v1/open is told of a tool context: its identity facts, whether it is sandboxed, its key. */
export function sessionFacts(ctx, cfg) {
  const facts = identityFacts(ctx, cfg);
  if (typeof ctx?.sandboxed === "boolean") facts.sandboxed = ctx.sandboxed;
  const key = ctx?.sessionKey;
  if (typeof key === "string" && key && Buffer.byteLength(key) <= MAX_SESSION_KEY_BYTES) facts.session_key = key;
  return facts;
}

function chatTypeOfKey(sessionKey) {
  // memory-core's deriveChatTypeFromSessionKey: citations default on in direct chats only
  const rest = typeof sessionKey === "string" && sessionKey.startsWith("agent:") ? sessionKey.split(":").slice(2) : [];
  const tokens = new Set(rest.map((t) => t.toLowerCase()));
  if (tokens.has("channel")) return "channel";
  if (tokens.has("group")) return "group";
  return "direct";
}

function citationsMode(cfg) {
  const mode = cfg?.memory?.citations;
  return mode === "on" || mode === "off" || mode === "auto" ? mode : "auto";
}

// ---------------------------------------------------------------- arguments

function record(params) {
  if (params == null) return {};
  if (typeof params !== "object" || Array.isArray(params)) throw new ToolInputError("arguments must be an object");
  return params;
}

function onlyKeys(params, allowed) {
  const unknown = Object.keys(params).filter((k) => !allowed.includes(k));
  if (unknown.length) throw new ToolInputError(`unknown argument(s): ${unknown.sort().join(", ").slice(0, 200)}`);
}

function text(params, name, { required = false, max, allowEmpty = false } = {}) {
  const value = params[name];
  if (value === undefined) {
    if (required) throw new ToolInputError(`${name} required`);
    return undefined;
  }
  if (typeof value !== "string") throw new ToolInputError(`${name} must be a string`);
  if (!allowEmpty && !value.trim()) throw new ToolInputError(`${name} must not be empty`);
  if (value.length > max) throw new ToolInputError(`${name} must be at most ${max} characters`);
  return value;
}

function positiveInteger(params, name) {
  const value = params[name];
  if (value === undefined) return undefined;
  if (!Number.isSafeInteger(value) || value < 1) throw new ToolInputError(`${name} must be an integer >= 1`);
  return value;
}

function corpus(params, allowed) {
  const value = params.corpus;
  if (value === undefined) return undefined;
  if (!allowed.includes(value)) throw new ToolInputError(`corpus must be one of ${allowed.join(", ")}`);
  return value;
}

const SEARCH_PARAMETERS = {
  type: "object",
  properties: {
    query: { type: "string" },
    maxResults: { type: "integer", minimum: 1 },
    minScore: { type: "number" },
    corpus: { type: "string", enum: ["memory", "wiki", "all", "sessions"] },
  },
  required: ["query"],
  additionalProperties: false,
};

const GET_PARAMETERS = {
  type: "object",
  properties: {
    path: { type: "string" },
    from: { type: "integer", minimum: 1 },
    lines: { type: "integer", minimum: 1 },
    corpus: { type: "string", enum: ["memory", "wiki", "all"] },
  },
  required: ["path"],
  additionalProperties: false,
};

const WRITE_PARAMETERS = {
  type: "object",
  properties: {
    path: { type: "string", description: "Path in this session's memory view, e.g. private/notes/x.md or channel/x.md" },
    content: { type: "string", description: "The note's whole new content" },
  },
  required: ["path", "content"],
  additionalProperties: false,
};

// ---------------------------------------------------------------- shapes

function searchMode(arms) {
  const set = new Set(Array.isArray(arms) ? arms : []);
  if (set.has("words") && set.has("vectors")) return "hybrid";
  if (set.has("vectors")) return "vector";
  return "fts-only";
}

function toHit(result) {
  return {
    path: result.path,
    startLine: result.start_line,
    endLine: result.end_line,
    score: result.score,
    snippet: result.snippet,
    source: "memory",
  };
}

/** memory-core's citation: path#L5 for one line, path#L5-L9 otherwise. */
export function formatCitation(hit) {
  const range = hit.startLine === hit.endLine ? `#L${hit.startLine}` : `#L${hit.startLine}-L${hit.endLine}`;
  return `${hit.path}${range}`;
}

function present(hit, includeCitation) {
  const presented = { ...hit, corpus: hit.source };
  if (includeCitation) {
    presented.citation = formatCitation(hit);
    presented.snippet = `${hit.snippet.trimEnd()}\n\nSource: ${presented.citation}`;
  }
  return presented;
}

function selectHits(payload, { maxResults, minScore }) {
  const hits = (payload?.results ?? []).map(toHit);
  return hits.filter((h) => minScore === undefined || h.score >= minScore).slice(0, maxResults);
}

/** memory-core's read result: lines joined without the last newline, a continuation notice when truncated. */
function readResult(read) {
  const body = typeof read.text === "string" && read.text.endsWith("\n") ? read.text.slice(0, -1) : read.text ?? "";
  const nextFrom = Number.isSafeInteger(read.nextFrom) ? read.nextFrom : undefined;
  const truncated = nextFrom !== undefined;
  return {
    status: "ok",
    text: truncated && body ? `${body}\n\n[More content available. Use from=${nextFrom} to continue.]` : body,
    path: read.path,
    from: read.from,
    lines: read.lines,
    ...(truncated ? { truncated: true, nextFrom } : {}),
  };
}

function unavailable(error) {
  const message = error instanceof ScopefsApiError ? `scopefs: ${error.code}` : "scopefs: unavailable";
  const warning = "Memory search is unavailable: the scopefs memory service did not answer.";
  const action = "Check that `scopefs serve` is running on the configured socket, then retry memory_search.";
  return { results: [], disabled: true, unavailable: true, error: message, warning, action, debug: { warning, action, error: message } };
}

function refused(error) {
  return new ToolAuthorizationError(`scopefs refused this session (${error.reason ?? error.code})`);
}

// ---------------------------------------------------------------- the plugin

function configOf(api, ctx) {
  return ctx?.getRuntimeConfig?.() ?? ctx?.runtimeConfig ?? ctx?.config ?? api.config;
}

function agentOf(settings, agentId) {
  const agent = settings.agent ?? lower(agentId);
  if (!AGENT_ID.test(agent)) throw new ToolAuthorizationError("no scopefs agent for this OpenClaw agent");
  return agent;
}

function createTools(api, settings, client) {
  const searchTool = (ctx) => ({
    label: "Memory Search",
    name: "memory_search",
    description:
      "Mandatory recall step: search this conversation's memory (scopefs: only what this chat's verified identity may see) " +
      "before answering questions about prior work, decisions, dates, people, preferences, or todos. " +
      "Use memory_get with a result's path and startLine to read more.",
    parameters: SEARCH_PARAMETERS,
    async execute(_toolCallId, rawParams) {
      const params = record(rawParams);
      onlyKeys(params, ["query", "maxResults", "minScore", "corpus"]);
      const query = text(params, "query", { required: true, max: MAX_QUERY_CHARS });
      const maxResults = Math.min(positiveInteger(params, "maxResults") ?? DEFAULT_RESULTS, MAX_RESULTS);
      const minScore = params.minScore;
      if (minScore !== undefined && (typeof minScore !== "number" || !Number.isFinite(minScore))) {
        throw new ToolInputError("minScore must be a number");
      }
      const requested = corpus(params, ["memory", "wiki", "all", "sessions"]);
      const cfg = configOf(api, ctx);
      const mode = citationsMode(cfg);
      if (requested === "sessions") {
        return jsonResult({ ...unavailable(), error: "scopefs indexes no session transcripts", provider: "scopefs" });
      }
      if (requested === "wiki") return jsonResult({ results: [], provider: "scopefs", citations: mode });
      const agent = agentOf(settings, ctx.agentId);
      let payload;
      try {
        payload = await client.call(agent, sessionFacts(ctx, cfg), "search", { query, limit: maxResults });
      } catch (error) {
        if (error instanceof ScopefsApiError && error.code === "denied") throw refused(error);
        if (error instanceof ScopefsApiError && error.code === "bad-input") throw new ToolInputError(error.message);
        api.logger?.warn?.(`scopefs: memory_search failed (${error?.code ?? "error"})`);
        return jsonResult(unavailable(error));
      }
      const include = mode === "on" || (mode === "auto" && chatTypeOfKey(ctx.sessionKey) === "direct");
      return jsonResult({
        results: selectHits(payload, { maxResults, minScore }).map((hit) => present(hit, include)),
        provider: "scopefs",
        citations: mode,
        mode: searchMode(payload?.arms),
      });
    },
  });

  const getTool = (ctx) => ({
    label: "Memory Get",
    name: "memory_get",
    description:
      "Safe exact excerpt read from this conversation's memory (scopefs). Defaults to a bounded excerpt " +
      `(at most ${MAX_READ_LINES} lines / 12,000 characters) and includes truncation/continuation info (nextFrom).`,
    parameters: GET_PARAMETERS,
    async execute(_toolCallId, rawParams) {
      const params = record(rawParams);
      onlyKeys(params, ["path", "from", "lines", "corpus"]);
      const path = text(params, "path", { required: true, max: MAX_PATH_CHARS });
      const from = positiveInteger(params, "from") ?? 1;
      const lines = Math.min(positiveInteger(params, "lines") ?? MAX_READ_LINES, MAX_READ_LINES);
      const requested = corpus(params, ["memory", "wiki", "all"]);
      if (requested === "wiki") return jsonResult({ status: "not_found", text: "", path });
      const agent = agentOf(settings, ctx.agentId);
      try {
        const read = await client.call(agent, sessionFacts(ctx, configOf(api, ctx)), "read", { path, from, lines });
        return jsonResult(readResult(read));
      } catch (error) {
        if (error instanceof ScopefsApiError && error.code === "denied") {
          // Hidden and missing look the same to the caller (scopefs says outside-view for both).
          if (error.reason === "outside-view") return jsonResult({ status: "not_found", text: "", path });
          throw refused(error);
        }
        if (error instanceof ScopefsApiError && error.code === "bad-input") throw new ToolInputError(error.message);
        api.logger?.warn?.(`scopefs: memory_get failed (${error?.code ?? "error"})`);
        const code = error instanceof ScopefsApiError ? error.code : "MEMORY_READ_FAILED";
        return jsonResult({ path, text: "", status: "error", code, error: "scopefs could not serve this read" });
      }
    },
  });

  const writeTool = (ctx) => ({
    label: "Memory Write",
    name: "memory_write",
    description:
      "Write a note into this conversation's memory (scopefs), replacing the note at that path: " +
      "private/... in a verified direct chat, channel/... in a group. Read-only places refuse.",
    parameters: WRITE_PARAMETERS,
    async execute(_toolCallId, rawParams) {
      const params = record(rawParams);
      onlyKeys(params, ["path", "content"]);
      const path = text(params, "path", { required: true, max: MAX_PATH_CHARS });
      const content = text(params, "content", { required: true, max: MAX_WRITE_CHARS, allowEmpty: true });
      const agent = agentOf(settings, ctx.agentId);
      try {
        // A flush is a machine capture: scopefs strips the chat envelope and keeps a human-notes block.
        const written = await client.call(agent, sessionFacts(ctx, configOf(api, ctx)), "write",
          { path, content, origin: "capture" });
        return jsonResult({ status: "ok", path, revision: written.revision, created: written.created, size: written.size });
      } catch (error) {
        if (error instanceof ScopefsApiError && error.code === "denied") throw refused(error);
        if (error instanceof ScopefsApiError && error.code === "bad-input") throw new ToolInputError(error.message);
        api.logger?.warn?.(`scopefs: memory_write failed (${error?.code ?? "error"})`);
        throw new Error("scopefs could not write this note");
      }
    },
  });

  return { searchTool, getTool, writeTool };
}

/** The host's memory runtime: no session identity ever reaches it, so it serves the ambiguous view only. */
function createRuntime(api, settings, client) {
  const ambiguousManager = (agent) => ({
    async search(query, opts = {}) {
      if (typeof query !== "string" || !query.trim() || query.length > MAX_QUERY_CHARS) return [];
      const maxResults = Math.min(Number.isSafeInteger(opts.maxResults) && opts.maxResults > 0 ? opts.maxResults : DEFAULT_RESULTS, MAX_RESULTS);
      const minScore = typeof opts.minScore === "number" && Number.isFinite(opts.minScore) ? opts.minScore : undefined;
      try {
        const payload = await client.call(agent, {}, "search", { query, limit: maxResults }); // opts.sessionKey ignored on purpose
        return selectHits(payload, { maxResults, minScore });
      } catch (error) {
        api.logger?.warn?.(`scopefs: runtime search failed (${error?.code ?? "error"})`);
        return [];
      }
    },
    async readFile({ relPath, from, lines } = {}) {
      if (typeof relPath !== "string" || !relPath || relPath.length > MAX_PATH_CHARS) {
        return { status: "not_found", text: "", path: String(relPath ?? "") };
      }
      const args = {
        path: relPath,
        from: Number.isSafeInteger(from) && from > 0 ? from : 1,
        lines: Math.min(Number.isSafeInteger(lines) && lines > 0 ? lines : MAX_READ_LINES, MAX_READ_LINES),
      };
      try {
        return readResult(await client.call(agent, {}, "read", args));
      } catch {
        return { status: "not_found", text: "", path: relPath };
      }
    },
    status() {
      return {
        backend: "builtin",
        provider: "scopefs",
        model: "scopefs",
        custom: { owner: "scopefs", agent, view: "ambiguous" },
      };
    },
    async probeEmbeddingAvailability() {
      return { ok: true };
    },
    async probeVectorAvailability() {
      return true;
    },
    async close() {},
    // No listTriggerCandidates: trigger recall has no session identity and is skipped without it.
  });

  return {
    async getMemorySearchManager({ agentId, purpose } = {}) {
      let agent;
      try {
        agent = agentOf(settings, agentId);
      } catch {
        return { manager: null, error: "no scopefs agent for this OpenClaw agent" };
      }
      return { manager: ambiguousManager(agent), debug: { backend: "builtin", purpose: purpose ?? "default", managerMs: 0 } };
    },
    resolveMemoryBackendConfig() {
      return { backend: "builtin" };
    },
    // The host calls this on its own surfaces with only a session key: no channel or account to verify it
    // against, so no hit can be shown to belong to that session. Fail closed.
    async authorizeSearchHits() {
      return [];
    },
    async closeMemorySearchManager() {},
    async closeAllMemorySearchManagers() {
      client.sessions.clear();
    },
  };
}

function promptBuilder({ availableTools }) {
  if (!availableTools?.has?.("memory_search") && !availableTools?.has?.("memory_get")) return [];
  return [
    "## Memory Recall",
    "Memory is scoped to this conversation's verified identity (scopefs): a direct chat sees its person's private notes, " +
      "a group sees its channel notes, and an unverified session sees only shared reference notes.",
    "Before answering anything about prior work, decisions, dates, people, preferences, or todos: run memory_search, " +
      "then memory_get to read the lines you need. Save lasting facts with memory_write.",
    "",
  ];
}

function registerCli(api, settings, client) {
  api.registerCli(
    ({ program }) => {
      const memory = program.command("memory").description("Inspect and search scopefs memory (no session: the ambiguous view)");
      const write = (opts, value, human) => {
        if (opts.json) process.stdout.write(`${JSON.stringify(value, null, 2)}\n`); // console.log goes to stderr under --json
        else process.stdout.write(`${human}\n`);
      };
      memory
        .command("status")
        .description("Show which memory backend owns the slot and whether scopefs answers")
        .option("--agent <id>", "OpenClaw agent id", "main")
        .option("--json", "print JSON")
        .action(async (opts) => {
          const status = { owner: "scopefs", provider: "scopefs", socket: settings.socket ?? null, agent: null, reachable: false };
          try {
            status.agent = agentOf(settings, opts.agent);
            status.view = (await client.open(status.agent, {}, true)).subject;
            status.reachable = true;
          } catch (error) {
            status.error = error?.code ?? error?.name ?? "error";
            process.exitCode = 1;
          }
          write(opts, status, `Memory: scopefs (socket ${status.socket}, agent ${status.agent}, ${status.reachable ? "reachable" : "unreachable"})`);
        });
      memory
        .command("search")
        .description("Search memory without a session: only what the ambiguous view allows")
        .argument("<query>", "what to search for")
        .option("--agent <id>", "OpenClaw agent id", "main")
        .option("--max-results <n>", "at most this many results", String(DEFAULT_RESULTS))
        .option("--json", "print JSON")
        .action(async (query, opts) => {
          const maxResults = Math.min(Math.max(Number.parseInt(opts.maxResults, 10) || DEFAULT_RESULTS, 1), MAX_RESULTS);
          try {
            const agent = agentOf(settings, opts.agent);
            const payload = await client.call(agent, {}, "search", { query, limit: maxResults });
            const results = selectHits(payload, { maxResults }).map((hit) => present(hit, true));
            write(opts, { results, provider: "scopefs", view: "ambiguous" },
              results.map((r) => `${r.citation}  ${r.score.toFixed(4)}`).join("\n") || "no results");
          } catch (error) {
            process.stderr.write(`scopefs: memory search failed (${error?.code ?? error?.name ?? "error"})\n`);
            process.exitCode = 1;
          }
        });
    },
    { descriptors: [{ name: "memory", description: "Inspect and search scopefs memory", hasSubcommands: true }] },
  );
}

export default {
  id: "scopefs",
  name: "scopefs memory",
  description: "Memory served by scopefs: each session sees only what its verified identity allows",
  kind: "memory",
  register(api) {
    const settings = { ...(api.pluginConfig ?? {}) };
    if (typeof settings.socket !== "string" || !settings.socket) {
      api.logger?.warn?.("scopefs: plugins.entries.scopefs.config.socket is not set; memory tools will be unavailable");
    }
    const client = new Scopefs(settings.socket ?? "");
    const { searchTool, getTool, writeTool } = createTools(api, settings, client);
    api.registerMemoryCapability({
      promptBuilder,
      // No pre-compaction flush: the host runs it with only `read` and an append-only `write` into a
      // workspace file (memory/YYYY-MM-DD.md), never our tools, and tells the resolver no session, so
      // a flush could not land in the session's own store. null is the SDK's "no flush this cycle".
      flushPlanResolver: () => null,
      runtime: createRuntime(api, settings, client),
    });
    api.registerTool((ctx) => searchTool(ctx ?? {}), { names: ["memory_search"] });
    api.registerTool((ctx) => getTool(ctx ?? {}), { names: ["memory_get"] });
    api.registerTool((ctx) => writeTool(ctx ?? {}), { names: ["memory_write"] });
    if (typeof api.registerCli === "function") registerCli(api, settings, client);
  },
};
