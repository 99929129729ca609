// The chat page's calls to this server's `/v1` API (the one every client uses), and the one
// line each failure becomes: the server's own error message with its status, so a 401, a 413 or
// a 503 reads in the page as the server said it.

// A failure to show: `message` is the line, `status` the HTTP status (0: no answer at all).
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(key, json) {
  const h = {};
  if (key) h.Authorization = `Bearer ${key}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function call(path, key, init) {
  let resp;
  try {
    resp = await fetch(path, { ...init, headers: headers(key, init.body !== undefined) });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, `Cannot reach the server at ${location.host} (${e.message}).`);
  }
  if (!resp.ok) throw await failure(resp);
  return resp;
}

// The one line for an answer that is not 2xx: the OpenAI-shaped `error.message` when there
// is one, else the start of the body, else the status text.
async function failure(resp) {
  let text = "";
  try {
    text = await resp.text();
  } catch {
    // The body could not be read: the status alone says enough.
  }
  let message = "";
  try {
    message = JSON.parse(text)?.error?.message || "";
  } catch {
    message = text.split("\n")[0].slice(0, 300);
  }
  message = message || resp.statusText || "no message";
  const retry = resp.headers.get("Retry-After");
  const later = retry ? ` (try again in ${retry} s)` : "";
  return new ApiError(resp.status, `Error ${resp.status}: ${message}${later}`);
}

// `GET path` as JSON.
export async function getJson(path, key) {
  const resp = await call(path, key, { method: "GET" });
  return resp.json();
}

// `GET /health`: "ok", "loading", "shutting down", or null when the server does not answer.
export async function health() {
  try {
    const resp = await fetch("/health");
    return (await resp.json()).status || null;
  } catch {
    return null;
  }
}

// Streams `POST /v1/chat/completions`: yields each chunk object. Throws an ApiError for a
// refused request, an error event or a stream that ends without `[DONE]`; an AbortError when
// `signal` stops it.
export async function* chatStream(body, key, signal) {
  const resp = await call("/v1/chat/completions", key, {
    method: "POST",
    body: JSON.stringify(body),
    signal,
  });
  for await (const data of sseData(resp.body, signal)) {
    if (data === "[DONE]") return;
    let chunk;
    try {
      chunk = JSON.parse(data);
    } catch {
      throw new ApiError(resp.status, `The server sent an event that is not JSON: ${data.slice(0, 100)}`);
    }
    if (chunk.error) throw new ApiError(resp.status, `Error: ${chunk.error.message || "the stream failed"}`);
    yield chunk;
  }
  if (!signal.aborted) throw new ApiError(resp.status, "The stream ended before the reply finished.");
}

// The `data:` payloads of a server-sent-event stream (comments such as `: keep-alive` are
// skipped).
async function* sseData(stream, signal) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let end;
      while ((end = buf.search(/\r?\n\r?\n/)) >= 0) {
        const event = buf.slice(0, end);
        buf = buf.slice(end).replace(/^\r?\n\r?\n/, "");
        const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data) yield data;
      }
    }
  } finally {
    // Leaving early (stop, an error) closes the connection: the server cancels the generation.
    if (!signal.aborted) reader.cancel().catch(() => {});
  }
}
