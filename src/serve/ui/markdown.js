// Markdown for the chat page, hand-written rather than taken from a library: the page is built
// into the binary, nothing of a third party is committed to this repository (no vendored copy,
// no CDN: the page works offline), and models write a small subset (paragraphs, headings,
// lists, quotes, tables, fenced code, emphasis, inline code, links).
//
// Safe by construction: the whole text is HTML-escaped first, and every tag in the result is
// one this file writes around escaped text. A link keeps only an http(s) or mailto target, and
// no attribute takes text from the reply except such a target (escaped, inside quotes) and a
// code block's language (letters, digits, `+#.-` only). So a reply can show `<script>` but
// never run one.

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ESC[c]);
}

// The HTML of a Markdown text. Unclosed constructs (a fence still streaming) render as far as
// they go.
export function render(src) {
  // NUL marks held fragments below; a reply's own NULs become U+FFFD.
  const text = escapeHtml(src.replace(/\r\n?/g, "\n").replace(/\u0000/g, "\uFFFD"));
  return blocks(text.split("\n"), false, 0);
}

const FENCE = /^( {0,3})(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}&gt; ?/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*))?$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
// Nesting deeper than this (quotes in quotes…) renders as text: bounded recursion.
const MAX_DEPTH = 16;

// Block parsers, tried in order; each returns [html, next line] or null.
const PARSERS = [fence, heading, rule, quote, list, table];

function blocks(lines, tight, depth) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    if (!lines[i].trim()) {
      i++;
      continue;
    }
    let hit = null;
    if (depth < MAX_DEPTH) {
      for (const p of PARSERS) {
        hit = p(lines, i, depth);
        if (hit) break;
      }
    }
    hit = hit || paragraph(lines, i, tight, depth);
    out.push(hit[0]);
    i = hit[1];
  }
  return out.join("\n");
}

function startsBlock(lines, i) {
  const l = lines[i];
  return FENCE.test(l) || HEADING.test(l) || RULE.test(l) || QUOTE.test(l) || ITEM.test(l) ||
    isTable(lines, i);
}

function paragraph(lines, i, tight, depth) {
  const body = [lines[i]];
  let j = i + 1;
  while (j < lines.length && lines[j].trim() && (depth >= MAX_DEPTH || !startsBlock(lines, j))) {
    body.push(lines[j]);
    j++;
  }
  const html = inline(body.map((l) => l.trim()).join("\n"));
  return [tight ? html : `<p>${html}</p>`, j];
}

function fence(lines, i) {
  const m = FENCE.exec(lines[i]);
  if (!m) return null;
  const [, indent, mark, lang] = m;
  const close = new RegExp(`^ {0,3}${mark[0] === "`" ? "`" : "~"}{${mark.length},}\\s*$`);
  const body = [];
  let j = i + 1;
  for (; j < lines.length && !close.test(lines[j]); j++) {
    body.push(lines[j].replace(new RegExp(`^ {0,${indent.length}}`), ""));
  }
  const head = `<div class="code-head"><span>${lang || "text"}</span>` +
    `<button type="button" class="copy">Copy</button></div>`;
  const html = `<div class="code">${head}<pre><code>${body.join("\n")}</code></pre></div>`;
  return [html, Math.min(j + 1, lines.length)];
}

function heading(lines, i) {
  const m = HEADING.exec(lines[i]);
  if (!m) return null;
  const n = m[1].length;
  return [`<h${n}>${inline(m[2])}</h${n}>`, i + 1];
}

function rule(lines, i) {
  return RULE.test(lines[i]) ? ["<hr>", i + 1] : null;
}

function quote(lines, i, depth) {
  if (!QUOTE.test(lines[i])) return null;
  const body = [];
  let j = i;
  // Quoted lines, and lines that continue a quoted paragraph without the marker.
  while (j < lines.length && (QUOTE.test(lines[j]) || (lines[j].trim() && !startsBlock(lines, j) &&
      body.length && body[body.length - 1].trim()))) {
    body.push(lines[j].replace(QUOTE, ""));
    j++;
  }
  return [`<blockquote>${blocks(body, false, depth + 1)}</blockquote>`, j];
}

function list(lines, i, depth) {
  const first = ITEM.exec(lines[i]);
  if (!first) return null;
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const items = [];
  let j = i;
  let loose = false;
  while (j < lines.length) {
    const m = ITEM.exec(lines[j]);
    if (!m || m[1].length > indent + 1 || m[1].length < indent || /\d/.test(m[2]) !== ordered) {
      break;
    }
    const [body, next, gap] = item(lines, j, m);
    items.push(body);
    loose = loose || gap;
    j = next;
  }
  const html = items.map((b) => `<li>${blocks(b, !loose, depth + 1)}</li>`).join("");
  const start = ordered ? parseInt(first[2], 10) : 1;
  if (!ordered) return [`<ul>${html}</ul>`, j];
  return [start === 1 ? `<ol>${html}</ol>` : `<ol start="${start}">${html}</ol>`, j];
}

// One list item: its lines (the text after the marker, then the lines indented under it or
// continuing its paragraph), the line after it, and whether a blank line separated it from
// what follows (a loose list).
function item(lines, j, m) {
  const width = m[1].length + m[2].length + 1;
  const body = [m[3] || ""];
  let k = j + 1;
  let blank = false;
  while (k < lines.length) {
    const l = lines[k];
    const lead = l.length - l.trimStart().length;
    if (!l.trim()) {
      blank = true;
    } else if (lead >= Math.min(width, m[1].length + 2)) {
      blank = false;
    } else if (blank || ITEM.test(l) || startsBlock(lines, k)) {
      break;
    }
    body.push(l.slice(Math.min(lead, width)));
    k++;
  }
  while (body.length > 1 && !body[body.length - 1].trim()) body.pop();
  const gap = blank && k < lines.length && ITEM.test(lines[k]);
  return [body, k, gap];
}

function isTable(lines, i) {
  return i + 1 < lines.length && lines[i].includes("|") && lines[i + 1].includes("|") &&
    lines[i + 1].includes("-") && TABLE_SEP.test(lines[i + 1]);
}

function table(lines, i) {
  if (!isTable(lines, i)) return null;
  const aligns = cells(lines[i + 1]).map((c) => {
    const l = c.startsWith(":");
    const r = c.endsWith(":");
    return l && r ? ' class="center"' : r ? ' class="right"' : "";
  });
  const row = (line, tag) =>
    "<tr>" + cells(line).map((c, k) => `<${tag}${aligns[k] || ""}>${inline(c)}</${tag}>`).join("") +
    "</tr>";
  let j = i + 2;
  const rows = [];
  for (; j < lines.length && lines[j].includes("|") && lines[j].trim(); j++) rows.push(row(lines[j], "td"));
  const html = `<div class="table"><table><thead>${row(lines[i], "th")}</thead>` +
    `<tbody>${rows.join("")}</tbody></table></div>`;
  return [html, j];
}

function cells(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

// Inline Markdown of escaped text: code spans, escapes, links, emphasis, line breaks.
function inline(s) {
  const held = [];
  const hold = (html) => `\u0000${held.push(html) - 1}\u0000`;
  s = s.replace(/(`+)([\s\S]*?[^`])\1(?!`)/g, (_, _t, code) =>
    hold(`<code>${code.replace(/^ ([\s\S]*) $/, "$1")}</code>`));
  s = s.replace(/\\(&(?:amp|lt|gt|quot|#39);|[!-/:-@[-`{-~])/g, (_, c) => hold(c));
  s = s.replace(/\[([^\]\n]+)\]\(\s*((?:https?:\/\/|mailto:)[^\s()\u0000]+)\s*\)/g,
    (_, text, url) => hold(link(url, emphasis(text))));
  s = s.replace(/\bhttps?:\/\/(?:[^\s&\u0000]|&amp;)+/g, (url) => {
    const tail = /[.,:;!?)\]*_~]+$/.exec(url);
    const bare = tail ? url.slice(0, -tail[0].length) : url;
    return hold(link(bare, bare)) + (tail ? tail[0] : "");
  });
  s = emphasis(s).replace(/\n/g, "<br>");
  // Held fragments may hold others (a code span in a link's text).
  for (let n = 0; n <= held.length && s.includes("\u0000"); n++) {
    s = s.replace(/\u0000(\d+)\u0000/g, (_, k) => held[Number(k)]);
  }
  return s;
}

function link(url, text) {
  return `<a href="${url}" target="_blank" rel="noopener noreferrer">${text}</a>`;
}

function emphasis(s) {
  return s
    .replace(/\*\*(?=\S)([^\n]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w])__(?=\S)([^\n]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/\*(?=[^\s*])([^*\n]*?[^\s*])\*/g, "<em>$1</em>")
    .replace(/(^|[^\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)([^\n]*?\S)~~/g, "<del>$1</del>");
}
