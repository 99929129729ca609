// What the page keeps in the browser's localStorage (per origin, so each server address has
// its own): the conversations (an index of ids and titles, and one entry per conversation, so
// saving the one that streams rewrites only it), which one is open, the settings and the API
// key. Anything unreadable there (hand-edited, from another version) is skipped, never fatal.

const INDEX = "inferno.chats";
const CHAT = "inferno.chat.";
const CURRENT = "inferno.current";
const SETTINGS = "inferno.settings";
const API_KEY = "inferno.apiKey";

function read(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v ?? fallback;
  } catch {
    return fallback;
  }
}

// Writes, or returns the one line that says why it could not (the storage is full, or off).
function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return null;
  } catch (e) {
    const full = e.name === "QuotaExceededError";
    return full
      ? "Could not save: the browser's storage for this page is full (delete old conversations)."
      : `Could not save: ${e.message}`;
  }
}

function validMessage(m) {
  return m && (m.role === "user" || m.role === "assistant") && typeof m.content === "string";
}

// The conversations, most recently updated first: `{id, title, updated}` only.
export function listChats() {
  const index = read(INDEX, []);
  if (!Array.isArray(index)) return [];
  return index
    .filter((c) => c && typeof c.id === "string" && typeof c.title === "string")
    .sort((a, b) => (b.updated || 0) - (a.updated || 0));
}

// One whole conversation `{id, title, created, updated, messages}`, or null.
export function loadChat(id) {
  const c = read(CHAT + id, null);
  if (!c || typeof c !== "object" || !Array.isArray(c.messages)) return null;
  c.messages = c.messages.filter(validMessage);
  return c;
}

// Saves a conversation and its index entry; null, or the line saying why not.
export function saveChat(chat) {
  chat.updated = Date.now();
  const err = write(CHAT + chat.id, chat);
  if (err) return err;
  const index = listChats().filter((c) => c.id !== chat.id);
  index.push({ id: chat.id, title: chat.title, updated: chat.updated });
  return write(INDEX, index);
}

function remove(key) {
  try {
    localStorage.removeItem(key);
  } catch {
    // Storage is off: there is nothing to remove.
  }
}

export function deleteChat(id) {
  remove(CHAT + id);
  write(INDEX, listChats().filter((c) => c.id !== id));
  if (currentChat() === id) setCurrentChat(null);
}

export function newChat() {
  const id = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
  return { id, title: "New chat", created: Date.now(), updated: Date.now(), messages: [] };
}

export function currentChat() {
  const id = read(CURRENT, null);
  return typeof id === "string" ? id : null;
}

export function setCurrentChat(id) {
  if (id) write(CURRENT, id);
  else remove(CURRENT);
}

// The sampling settings as the form holds them (strings; empty means the server's default).
export function loadSettings() {
  const s = read(SETTINGS, {});
  return s && typeof s === "object" ? s : {};
}

export function saveSettings(s) {
  write(SETTINGS, s);
}

export function apiKey() {
  const key = read(API_KEY, "");
  return typeof key === "string" ? key : "";
}

// Keeps the key (or forgets it when empty); null, or the line saying why it could not.
export function setApiKey(key) {
  if (key) return write(API_KEY, key);
  remove(API_KEY);
  return null;
}

// Whether another tab changed the conversations (the `storage` event's key).
export function isChatKey(key) {
  return key === null || key === INDEX || key.startsWith(CHAT);
}
