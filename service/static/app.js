// The attnserve page: it calls the public API (GET /models, /samples; POST /classify, /translate;
// GET /attention/{id}.png) like any client would.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { vit: null, translator: null, vitId: null, trId: null };

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

// With API keys on, the service answers 401 until the page sends one: the page then asks for it and
// keeps it in this tab only (sessionStorage), never in a cookie or on disk.
class KeyNeeded extends Error {}

function authed(options = {}) {
  const key = sessionStorage.getItem("attnserve-key");
  return key ? { ...options, headers: { ...(options.headers || {}), Authorization: `Bearer ${key}` } } : options;
}

async function get(path, options) {
  const r = await fetch(path, authed(options));
  if (r.status === 401) {
    $("key-form").hidden = false;
    throw new KeyNeeded("This service needs an API key: enter it above.");
  }
  return r;
}

async function api(path, options) {
  const r = await get(path, options);
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${r.status}`);
  return body;
}

// Images from the API (samples, heatmaps): by URL, or, when the page holds a key (an <img> cannot
// send one), fetched with it and shown from a blob URL. An <img> is shown only while it holds its
// picture: hidden before the first one and when one fails, never the browser's broken-image icon.
async function showImage(img, path) {
  let src = path;
  try {
    if (sessionStorage.getItem("attnserve-key")) {
      const r = await get(path);
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      src = URL.createObjectURL(await r.blob());
    }
    const previous = img.src;
    await new Promise((resolve, reject) => {
      img.onload = resolve;
      img.onerror = () => reject(new Error("the service sent no picture"));
      img.src = src;
    });
    if (previous.startsWith("blob:")) URL.revokeObjectURL(previous);
    img.hidden = false;
  } catch (e) {
    img.hidden = true;
    if (src.startsWith("blob:")) URL.revokeObjectURL(src);
    throw new Error(`Could not load ${path}: ${e.message}`);
  }
}

function fillSelect(select, values, labels = values) {
  select.replaceChildren(...values.map((v, i) => new Option(labels[i], v)));
}

function heads(n) {
  return [["", ...Array.from({ length: n }, (_, i) => i)], ["mean", ...Array.from({ length: n }, (_, i) => `${i}`)]];
}

async function loadModels() {
  const { models } = await api("/models");
  $("models").replaceChildren(...models.map((m) => {
    const li = document.createElement("li");
    const pinnedOnly = m.unpinned === false ? ", pinned requests only" : "";
    li.textContent = `${m.name} v${m.version} (${m.task}) on ${m.provider || m.status}${pinnedOnly}`;
    return li;
  }));
  // the version that answers requests naming no version: what this page's requests get
  const serving = (task) => models.find((m) => m.task === task && m.status === "ready" && m.unpinned !== false);
  state.vit = serving("image-classification");
  state.translator = serving("translation");
  if (state.vit && state.vit.attention) {
    const a = state.vit.attention;
    fillSelect($("vit-layer"), [...Array(a.layers).keys()]);
    $("vit-layer").value = a.layers - 1;
    fillSelect($("vit-head"), ...heads(a.heads));
  }
  if (state.translator && state.translator.attention) setTranslatorSelectors();
  if (state.translator) describeTranslator(state.translator.evaluation || {});
}

// What the translator is good for, from its manifest's per-domain test scores (GET /models).
const DOMAINS = { help: "help pages", ui: "UI labels", wesnoth: "game dialogue", freeciv: "game help",
                  everyday: "everyday sentences" };

function describeTranslator(evaluation) {
  const domains = evaluation.domains;
  if (!domains) return;
  const beam = Object.keys(evaluation).find((k) => /^beam\d+$/.test(k)) || "greedy";
  const scores = Object.entries(DOMAINS).filter(([d]) => domains[d])
    .map(([d, name]) => `${name} ${domains[d][beam].bleu.toFixed(1)}`);
  const unseen = evaluation.heldout?.[beam]  // the held-out system catalogs, when the manifest records them
    ? ` Messages of software it never saw: BLEU ${evaluation.heldout[beam].bleu.toFixed(1)}.` : "";
  $("translator-note").textContent = `Trained on software help and UI text, game dialogue and dictionary ` +
    `sentences. Test BLEU (${beam.replace("beam", "beam ")}): ${scores.join(", ")}.${unseen} ` +
    `Sample sentences marked ✓ it translates well, ✗ badly.`;
  $("translator-note").hidden = false;
}

function setTranslatorSelectors() {
  const a = state.translator.attention;
  const layers = $("tr-kind").value === "encoder" ? a.encoder_layers : a.decoder_layers;
  fillSelect($("tr-layer"), [...Array(layers).keys()]);
  $("tr-layer").value = layers - 1;
  fillSelect($("tr-head"), ...heads(a.heads));
}

async function loadSamples() {
  const { images, texts } = await api("/samples");
  $("samples").replaceChildren(...images.map((s) => {
    const b = document.createElement("button");
    b.type = "button";
    b.setAttribute("role", "listitem");
    b.title = b.ariaLabel = `Sample: ${s.label}`;
    const img = new Image(56, 56);
    img.hidden = true;
    showImage(img, s.url).catch((e) => status(e.message, true));
    img.alt = s.label;
    b.append(img);
    b.onclick = async () => classify(await (await get(s.url)).blob());
    return b;
  }));
  const marks = { good: ["✓ ", "translates well"], fair: ["", "translates fairly"], poor: ["✗ ", "translates badly"] };
  $("sentences").replaceChildren(...texts.map((t) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = t.quality ? `chip ${t.quality}` : "chip";
    const [mark, meaning] = marks[t.quality] || ["", ""];
    b.textContent = mark + t.text;
    if (meaning) b.title = `The model ${meaning} (${t.domain}); reference: ${t.reference}`;
    b.onclick = () => { $("text").value = t.text; $("translate-form").requestSubmit(); };
    return b;
  }));
}

const toBase64 = (blob) => new Promise((resolve, reject) => {
  const reader = new FileReader();
  reader.onload = () => resolve(reader.result);  // a data URL: the service accepts it as is
  reader.onerror = reject;
  reader.readAsDataURL(blob);
});

async function classify(blob) {
  status("Classifying…");
  try {
    const body = await api("/classify", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ images: [await toBase64(blob)], top_k: 5, return_attention: true }),
    });
    const result = body.results[0];
    state.vitId = result.attention_id;
    $("topk").replaceChildren(...result.top_k.map((t) => {
      const li = document.createElement("li");
      const pct = (100 * t.score).toFixed(1);
      li.innerHTML = `<span class="label"></span><meter min="0" max="1" value="${t.score}"></meter><span class="pct">${pct}%</span>`;
      li.querySelector(".label").textContent = t.label;
      return li;
    }));
    $("classify-result").hidden = false;
    updateVitHeatmap();
    status(result.attention_id ? `${result.top_k[0].label} (${body.model} v${body.version})` : `No attention id: ${result.attention_error.message}`);
  } catch (e) { status(e.message, true); }
}

function updateVitHeatmap() {
  if (!state.vitId) {  // an image classified without attention: not the previous image's map either
    $("vit-heatmap").hidden = true;
    return;
  }
  const kind = $("vit-kind").value;
  $("vit-layer").disabled = $("vit-head").disabled = kind === "rollout";
  $("vit-fusion").disabled = kind !== "rollout";
  const q = new URLSearchParams({ kind });
  if (kind === "rollout") q.set("fusion", $("vit-fusion").value);
  else {
    q.set("layer", $("vit-layer").value);
    if ($("vit-head").value !== "") q.set("head", $("vit-head").value);
  }
  showImage($("vit-heatmap"), `/attention/${state.vitId}.png?${q}`).catch((e) => status(e.message, true));
}

async function translate(event) {
  event.preventDefault();
  status("Translating…");
  try {
    const body = await api("/translate", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text: $("text").value, beam_size: Number($("beam").value), return_attention: true }),
    });
    const result = body.results[0];
    $("translation").textContent = result.translation;
    showPlaceholders(result);
    state.trId = result.attention_id;
    $("translate-result").hidden = false;
    updateAlignment();
    status(`Translated by ${body.model} v${body.version}`);
  } catch (e) { status(e.message, true); }
}

// What the service protected (placeholders, tags, escapes: each came back exactly once) and how the text was split.
function showPlaceholders(result) {
  const list = $("placeholders");
  list.replaceChildren(...result.placeholders.map((p) => {
    const li = document.createElement("li");
    const code = document.createElement("code");
    code.textContent = p.text;
    li.append(code, p.restored ? " ✓" : " ✗ lost");
    li.title = `${p.kind}: ${p.restored ? "came back verbatim" : "did not come back"}`;
    return li;
  }));
  list.hidden = result.placeholders.length === 0;
  const cut = result.sentences.filter((s) => !s.finished).length;
  const parts = [];
  if (result.sentences.length > 1) parts.push(`${result.sentences.length} sentences, translated as one batch.`);
  if (cut) parts.push(`${cut} cut at the length limit (max_new_tokens).`);
  $("sentence-note").textContent = parts.join(" ");
  $("sentence-note").hidden = parts.length === 0;
}

function updateAlignment() {
  if (!state.trId) {
    $("alignment").hidden = true;
    return;
  }
  const q = new URLSearchParams({ kind: $("tr-kind").value, layer: $("tr-layer").value });
  if ($("tr-head").value !== "") q.set("head", $("tr-head").value);
  showImage($("alignment"), `/attention/${state.trId}.png?${q}`).catch((e) => status(e.message, true));
}

function setUpDrop() {
  const drop = $("drop");
  $("upload").onchange = () => $("upload").files[0] && classify($("upload").files[0]);
  drop.ondragover = (e) => { e.preventDefault(); drop.classList.add("over"); };
  drop.ondragleave = () => drop.classList.remove("over");
  drop.ondrop = (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files[0]) classify(e.dataTransfer.files[0]);
  };
}

document.addEventListener("DOMContentLoaded", async () => {
  ["vit-kind", "vit-fusion", "vit-layer", "vit-head"].forEach((id) => { $(id).onchange = updateVitHeatmap; });
  $("tr-kind").onchange = () => { setTranslatorSelectors(); updateAlignment(); };
  ["tr-layer", "tr-head"].forEach((id) => { $(id).onchange = updateAlignment; });
  $("translate-form").onsubmit = translate;
  setUpDrop();
  $("key-form").onsubmit = (event) => {
    event.preventDefault();
    sessionStorage.setItem("attnserve-key", $("key").value.trim());
    $("key").value = "";
    $("key-form").hidden = true;
    start();
  };
  await start();
});

async function start() {
  try {
    await loadModels();
    await loadSamples();
    status("Ready.");
  } catch (e) {
    status(e instanceof KeyNeeded ? e.message : `The service is not ready: ${e.message}`, true);
  }
}
