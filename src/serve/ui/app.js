// The chat page: conversations kept in this browser, each turn streamed from this server's
// `POST /v1/chat/completions` (the API every client uses, with the same key), stopped with an
// AbortController (closing the stream makes the server cancel the generation and free its
// sequence).

import { ApiError, chatStream, getJson, health } from "./api.js";
import * as store from "./store.js";
import * as view from "./view.js";

const $ = (id) => document.getElementById(id);

const state = {
  // The open conversation (null: a new one, saved on its first message).
  chat: null,
  // `{id, reasoning, context}` from /v1/models once known.
  model: null,
  // The turn streaming now: `{chat, reply, element, controller}`.
  active: null,
};

const SETTINGS = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "reasoning_effort"];
const NUMBERS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];

// ---- the model and the key

const NEEDS_KEY = "needs the API key";

async function loadModel() {
  try {
    const list = await getJson("/v1/models", store.apiKey());
    const m = list.data?.[0];
    if (!m) throw new ApiError(200, "The server lists no model.");
    state.model = { id: m.id, reasoning: m.reasoning === true, context: m.max_model_len };
    $("model-name").textContent = shortName(m.id);
    $("model-name").title = m.id;
    $("model-info").textContent = m.max_model_len ? `context ${m.max_model_len.toLocaleString()} tokens` : "";
    $("effort-field").hidden = !state.model.reasoning;
    document.title = `${m.id} · inferno`;
    if ($("server-state").textContent === NEEDS_KEY) $("server-state").textContent = "";
    return true;
  } catch (e) {
    view.showError(e.message);
    if (e.status === 401) {
      $("server-state").textContent = NEEDS_KEY;
      openPanel("key-panel", true);
    }
    return false;
  }
}

// What people call the model: a path's or repo id's last part, without `@rev` or `.gguf` (the
// alias the server also accepts).
function shortName(id) {
  const last = id.replace(/\/+$/, "").split("/").pop().split("@")[0].replace(/\.gguf$/, "");
  return last || id;
}

// Follows /health until the model is loaded (the server listens while it loads).
async function watchHealth() {
  const status = await health();
  const shown = { ok: "", loading: "loading the model…", "shutting down": "shutting down" };
  $("server-state").textContent = status === null ? "not answering" : shown[status] ?? status;
  if (status === "ok") {
    if (!state.model?.context) await loadModel();
    return;
  }
  setTimeout(watchHealth, status === null ? 3000 : 1000);
}

function saveKey(event) {
  event.preventDefault();
  const err = store.setApiKey($("api-key").value.trim());
  view.showError(err);
  if (err) return;
  loadModel().then((ok) => {
    if (ok) {
      view.showError("");
      openPanel("key-panel", false);
    }
  });
}

// ---- settings

function readSettings() {
  const form = $("settings-form");
  const s = {};
  for (const name of SETTINGS) s[name] = form.elements[name].value;
  return s;
}

function fillSettings(s) {
  const form = $("settings-form");
  for (const name of SETTINGS) form.elements[name].value = s[name] ?? "";
}

// The request's sampling fields: those set, as numbers (a value that is not one is refused
// here: JSON has no way to carry it to the server).
function samplingFields() {
  const s = readSettings();
  const body = {};
  for (const name of NUMBERS) {
    if (s[name].trim() === "") continue;
    const v = Number(s[name]);
    if (!Number.isFinite(v)) throw new ApiError(0, `Settings: ${name} is not a number.`);
    body[name] = v;
  }
  if (state.model?.reasoning && s.reasoning_effort) body.reasoning_effort = s.reasoning_effort;
  return { body, system: s.system.trim() };
}

// ---- conversations

// Shows a conversation (null: a new one). The one streaming is shown from memory, and its
// reply keeps streaming into the new element.
function openChat(id) {
  const live = state.active?.chat;
  state.chat = id ? (live?.id === id ? live : store.loadChat(id)) : null;
  store.setCurrentChat(state.chat?.id);
  view.renderMessages(state.chat);
  if (live && state.chat === live) state.active.element = $("messages").lastElementChild;
  refreshList();
  view.showError("");
  document.body.classList.remove("show-sidebar");
  $("input").focus();
}

function removeChat(id) {
  if (state.active?.chat.id === id) state.active.controller.abort();
  store.deleteChat(id);
  if (state.chat?.id === id) openChat(null);
  else refreshList();
}

function refreshList() {
  view.renderChatList(store.listChats(), state.chat?.id, { open: openChat, remove: removeChat });
}

function save(chat) {
  const err = store.saveChat(chat);
  if (err) view.showError(err);
  return !err;
}

// ---- a turn

function requestBody(chat, fields) {
  const messages = [];
  if (fields.system) messages.push({ role: "system", content: fields.system });
  for (const m of chat.messages) {
    // Failed turns and empty replies are not part of the conversation the model sees.
    if (m.role === "assistant" && (!m.content || m.state === "streaming")) continue;
    messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true }, ...fields.body };
  if (state.model) body.model = state.model.id;
  return body;
}

async function send(text) {
  if (state.active || !text.trim()) return;
  let fields;
  try {
    fields = samplingFields();
  } catch (e) {
    view.showError(e.message);
    return;
  }
  const chat = state.chat || store.newChat();
  if (!chat.messages.length) chat.title = text.trim().split("\n")[0].slice(0, 60);
  chat.messages.push({ role: "user", content: text });
  const body = requestBody(chat, fields);
  const reply = { role: "assistant", content: "", reasoning: "", state: "streaming" };
  chat.messages.push(reply);
  state.chat = chat;
  store.setCurrentChat(chat.id);
  view.renderMessages(chat);
  view.showError("");
  save(chat);
  refreshList();
  $("input").value = "";
  view.autosize($("input"));
  const active = { chat, reply, element: $("messages").lastElementChild, controller: new AbortController() };
  state.active = active;
  setBusy(true);
  await stream(active, body, text);
  state.active = null;
  setBusy(false);
}

// Runs one turn's stream into `active.reply`, then records how it ended.
async function stream(active, body, text) {
  const { reply, chat, controller } = active;
  const t = { start: performance.now(), first: null, content: null };
  const stats = {};
  let lastSave = 0;
  try {
    for await (const chunk of chatStream(body, store.apiKey(), controller.signal)) {
      absorb(chunk, reply, stats, t);
      schedule(active);
      if (performance.now() - lastSave > 1000 && reply.content) {
        lastSave = performance.now();
        store.saveChat(chat);
      }
    }
    reply.state = "done";
  } catch (e) {
    if (controller.signal.aborted) {
      reply.state = "stopped";
    } else if (e instanceof ApiError && e.status !== 200 && t.first === null) {
      return refused(active, e, text);
    } else {
      reply.state = "error";
      reply.error = e.message;
    }
  }
  finish(active, stats, t);
}

// Folds one chunk into the reply: text, reasoning, the finish reason, the usage.
function absorb(chunk, reply, stats, t) {
  const now = performance.now();
  for (const choice of chunk.choices || []) {
    const d = choice.delta || {};
    const reasoning = d.reasoning_content ?? d.reasoning ?? "";
    if ((d.content || reasoning) && t.first === null) t.first = now;
    if (d.content && t.content === null) t.content = now;
    reply.content += d.content || "";
    reply.reasoning += reasoning;
    if (choice.finish_reason) stats.finish = choice.finish_reason;
  }
  if (chunk.usage) {
    stats.prompt_tokens = chunk.usage.prompt_tokens;
    stats.cached_tokens = chunk.usage.prompt_tokens_details?.cached_tokens || 0;
    stats.tokens = chunk.usage.completion_tokens;
  }
}

// A request the server refused before any reply (401, 413, 400, 503…): its line is shown, the
// message goes back into the composer and out of the conversation, to send again once fixed.
function refused(active, e, text) {
  const { chat } = active;
  chat.messages.splice(-2, 2);
  if (!$("input").value) {
    $("input").value = text;
    view.autosize($("input"));
  }
  if (chat.messages.length) save(chat);
  else store.deleteChat(chat.id);
  if (state.chat === chat) view.renderMessages(chat);
  view.showError(e.message);
  if (e.status === 401) openPanel("key-panel", true);
  refreshList();
}

function finish(active, stats, t) {
  const { reply, chat } = active;
  const end = performance.now();
  stats.total_ms = end - t.start;
  if (t.first !== null) stats.ttft_ms = t.first - t.start;
  if (t.content !== null && reply.reasoning) stats.reasoning_ms = t.content - t.first;
  if (stats.tokens > 1 && t.first !== null && end > t.first) {
    stats.tok_s = (stats.tokens - 1) / ((end - t.first) / 1000);
  }
  reply.stats = stats;
  flushActive(active);
  save(chat);
  refreshList();
}

// ---- rendering a streaming reply: at most once a frame

let pending = false;

function schedule(active) {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    flushActive(active);
  });
}

function flushActive(active = state.active) {
  if (!active || state.chat !== active.chat) return;
  const box = $("messages");
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  view.updateAssistant(active.element, active.reply);
  if (atBottom) box.scrollTop = box.scrollHeight;
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  if (!busy) $("input").focus();
}

// ---- panels, composer, wiring

function openPanel(id, open) {
  const panel = $(id);
  const show = open ?? panel.hidden;
  panel.hidden = !show;
  const toggle = id === "settings" ? "settings-toggle" : "key-toggle";
  $(toggle).setAttribute("aria-expanded", String(show));
  if (show && id === "key-panel") {
    $("api-key").value = store.apiKey();
    $("api-key").focus();
  }
}

function copyCode(button) {
  const code = button.closest(".code")?.querySelector("code")?.textContent ?? "";
  const shown = (text) => {
    button.textContent = text;
    setTimeout(() => (button.textContent = "Copy"), 1500);
  };
  // The clipboard API needs a secure context (127.0.0.1 is one, a LAN address over http is not):
  // there, the older selection copy still works.
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(code).then(() => shown("Copied"), () => shown("Copy failed"));
    return;
  }
  const area = document.createElement("textarea");
  area.value = code;
  document.body.append(area);
  area.select();
  const ok = document.execCommand("copy");
  area.remove();
  shown(ok ? "Copied" : "Copy failed");
}

function wire() {
  const input = $("input");
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send(input.value);
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send(input.value);
    }
  });
  input.addEventListener("input", () => view.autosize(input));
  $("stop").addEventListener("click", () => state.active?.controller.abort());
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.active) state.active.controller.abort();
  });
  $("new-chat").addEventListener("click", () => openChat(null));
  $("menu-toggle").addEventListener("click", () => document.body.classList.toggle("show-sidebar"));
  document.querySelector("main").addEventListener("click", (e) => {
    if (e.target.id !== "menu-toggle") document.body.classList.remove("show-sidebar");
  });
  $("settings-toggle").addEventListener("click", () => openPanel("settings"));
  $("key-toggle").addEventListener("click", () => openPanel("key-panel"));
  $("key-form").addEventListener("submit", saveKey);
  $("key-forget").addEventListener("click", () => {
    store.setApiKey("");
    $("api-key").value = "";
  });
  $("settings-form").addEventListener("input", () => store.saveSettings(readSettings()));
  $("settings-form").addEventListener("submit", (e) => e.preventDefault());
  $("settings-reset").addEventListener("click", () => {
    fillSettings({});
    store.saveSettings({});
  });
  $("messages").addEventListener("click", (e) => {
    if (e.target.matches?.(".code .copy")) copyCode(e.target);
  });
  // Another tab changed the conversations: show its list (and its version of this one when
  // nothing streams here).
  window.addEventListener("storage", (e) => {
    if (!store.isChatKey(e.key)) return;
    if (!state.active && state.chat) openChat(state.chat.id);
    else refreshList();
  });
}

function start() {
  wire();
  fillSettings(store.loadSettings());
  const id = store.currentChat();
  const chat = id && store.loadChat(id);
  if (chat) {
    // A reply that was streaming when the page closed ended there.
    for (const m of chat.messages) if (m.state === "streaming") m.state = "interrupted";
  }
  state.chat = chat || null;
  view.renderMessages(state.chat);
  refreshList();
  loadModel();
  watchHealth();
  $("input").focus();
}

start();
