// The page's DOM: the conversation list, the messages, the stats line. Text from the model or
// the user reaches the DOM only as textContent or through the escaping Markdown renderer.

import { render } from "./markdown.js";

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

// The sidebar: one entry per conversation, the open one marked. Delete asks once more (the
// button turns into "Delete?" for a few seconds) rather than through a dialog.
export function renderChatList(chats, currentId, { open, remove }) {
  const nav = $("conversations");
  nav.replaceChildren(...chats.map((c) => {
    const row = el("div", c.id === currentId ? "conv current" : "conv");
    row.dataset.id = c.id;
    const title = el("button", "conv-open", c.title);
    title.type = "button";
    title.title = c.title;
    title.addEventListener("click", () => open(c.id));
    const del = el("button", "conv-delete", "×");
    del.type = "button";
    del.setAttribute("aria-label", `Delete “${c.title}”`);
    del.addEventListener("click", () => {
      if (del.classList.contains("confirm")) return remove(c.id);
      del.classList.add("confirm");
      del.textContent = "Delete?";
      setTimeout(() => {
        del.classList.remove("confirm");
        del.textContent = "×";
      }, 3000);
    });
    row.append(title, del);
    return row;
  }));
}

// All messages of a conversation (or the empty state).
export function renderMessages(chat) {
  const box = $("messages");
  const items = (chat?.messages || []).map(messageElement);
  box.replaceChildren(...(items.length ? items : [emptyState()]));
  box.scrollTop = box.scrollHeight;
}

function emptyState() {
  const e = el("div", "empty");
  e.id = "empty";
  const p = el("p", "", "Ask anything. Replies stream from this server's ");
  p.append(el("code", "", "/v1/chat/completions"), ".");
  e.append(p);
  return e;
}

// A new element for a message; an assistant's is filled by `updateAssistant`.
export function messageElement(m) {
  const e = el("article", `msg ${m.role}`);
  if (m.role === "user") {
    e.append(el("div", "bubble", m.content));
    return e;
  }
  const details = el("details", "reasoning");
  details.append(el("summary", ""), el("div", "reasoning-body markdown"));
  e.append(details, el("div", "content markdown"), el("div", "msg-error"), el("div", "stats"));
  updateAssistant(e, m);
  return e;
}

// Brings an assistant message's element up to date with `m` (its `<details>` keeps whether
// the user opened it).
export function updateAssistant(e, m) {
  e.dataset.state = m.state || "done";
  const details = e.querySelector(".reasoning");
  details.hidden = !m.reasoning;
  if (m.reasoning) {
    details.querySelector("summary").textContent = reasoningTitle(m);
    details.querySelector(".reasoning-body").innerHTML = render(m.reasoning);
  }
  const content = e.querySelector(".content");
  content.innerHTML = render(m.content);
  content.classList.toggle("typing", m.state === "streaming" && !m.content && !m.reasoning);
  const err = e.querySelector(".msg-error");
  err.hidden = !m.error;
  err.textContent = m.error || "";
  e.querySelector(".stats").textContent = statsLine(m);
}

function reasoningTitle(m) {
  if (m.state === "streaming" && !m.content) return "Thinking…";
  const ms = m.stats?.reasoning_ms;
  return ms ? `Thought for ${seconds(ms)}` : "Reasoning";
}

function seconds(ms) {
  return ms < 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 1000)} s`;
}

// `prompt 31 (12 cached) · 48 tokens · 35.2 tok/s · TTFT 180 ms · 1.6 s · stop`
export function statsLine(m) {
  const s = m.stats;
  if (!s) return m.state === "interrupted" ? "interrupted (the page was closed while it streamed)" : "";
  const parts = [];
  if (s.prompt_tokens !== undefined) {
    parts.push(`prompt ${s.prompt_tokens}${s.cached_tokens ? ` (${s.cached_tokens} cached)` : ""}`);
  }
  if (s.tokens !== undefined) parts.push(`${s.tokens} tokens`);
  if (s.tok_s) parts.push(`${s.tok_s.toFixed(1)} tok/s`);
  if (s.ttft_ms !== undefined) parts.push(`TTFT ${Math.round(s.ttft_ms)} ms`);
  if (s.total_ms !== undefined) parts.push(seconds(s.total_ms));
  if (m.state === "stopped") parts.push("stopped");
  else if (s.finish) parts.push(s.finish === "length" ? "length (max tokens)" : s.finish);
  return parts.join(" · ");
}

// The one-line error above the composer (empty hides it).
export function showError(text) {
  const e = $("error");
  e.textContent = text || "";
  e.hidden = !text;
}

// The textarea grows with its text, up to a third of the window.
export function autosize(t) {
  t.style.height = "auto";
  t.style.height = `${Math.min(t.scrollHeight, window.innerHeight / 3)}px`;
}
