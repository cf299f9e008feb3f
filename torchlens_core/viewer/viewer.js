// The TorchLens trace viewer: interaction on top of Graphviz's SVG. No framework, no network.
// Data: #tl-data (ops, modules, layouts' depths), #tl-layout-N (the SVG of layout N, parsed when first shown),
// #tl-pictures (value pictures, parsed on the first click on an op).
"use strict";
(function () {
  const t0 = performance.now();
  const DATA = JSON.parse(document.getElementById("tl-data").textContent);
  const ops = DATA.ops;
  const byLabel = new Map(ops.map((op) => [op.label, op]));
  const modules = new Map(DATA.modules.map((m) => [m.key, m]));
  const graph = document.getElementById("tl-graph");
  const panel = document.getElementById("tl-panel");
  const status = document.getElementById("tl-status");
  let pictures = null; // parsed lazily
  let layoutIndex = -1;
  let svg = null;
  let view = null; // {x, y, w, h}: the SVG viewBox
  let selected = null; // op index
  let matches = [];
  let matchAt = -1;
  // The module passes shown open (as clusters); every other module pass is one box.
  const open = new Set();

  // -- choosing and indexing a layout -------------------------------------------------------
  function neededDepth() { // one deeper than the deepest module pass shown open (all its ancestors open too)
    let d = 1;
    for (const key of open) {
      if (ancestors(key).every((k) => open.has(k))) d = Math.max(d, modules.get(key).depth + 1);
    }
    return d;
  }

  function pickLayout(depth) {
    let best = 0;
    DATA.layouts.forEach((layout, i) => { if (layout.depth <= depth && layout.available) best = i; });
    return best;
  }

  function parseTitle(el) {
    const title = el.querySelector(":scope > title");
    return title ? title.textContent : "";
  }

  function showLayout(i) {
    if (i === layoutIndex) return;
    layoutIndex = i;
    graph.innerHTML = document.getElementById("tl-layout-" + i).textContent;
    svg = graph.querySelector("svg");
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    const root = svg.querySelector("g.graph");
    const overlay = document.createElementNS("http://www.w3.org/2000/svg", "g");
    overlay.setAttribute("class", "tl-overlay");
    root.appendChild(overlay);
    svg.tl = { root, overlay, nodes: new Map(), clusters: new Map(), edges: [], up: new Map(), down: new Map() };
    for (const g of svg.querySelectorAll("g.node")) {
      const title = parseTitle(g);
      svg.tl.nodes.set(title, g);
      if (title.startsWith("op ")) {
        const op = ops[Number(title.slice(3))];
        g.dataset.op = op.index;
        g.dataset.chain = op.modules.join("\n");
        if (op.edits) g.classList.add("tl-edited");
      } else if (title.startsWith("module ")) {
        const key = title.slice(7);
        g.dataset.module = key;
        g.dataset.chain = ancestors(key).join("\n");
        g.classList.add("tl-modbox");
      }
    }
    for (const g of svg.querySelectorAll("g.cluster")) {
      const key = parseTitle(g).replace(/^cluster /, "");
      g.dataset.cluster = key;
      svg.tl.clusters.set(key, g);
    }
    for (const g of svg.querySelectorAll("g.edge")) {
      const [a, b] = parseTitle(g).split("->");
      const edge = { a, b, g };
      svg.tl.edges.push(edge);
      if (!svg.tl.down.has(a)) svg.tl.down.set(a, []);
      if (!svg.tl.up.has(b)) svg.tl.up.set(b, []);
      svg.tl.down.get(a).push(edge);
      svg.tl.up.get(b).push(edge);
    }
    const box = svg.viewBox.baseVal;
    svg.tl.full = { x: box.x, y: box.y, w: box.width, h: box.height };
    fitWidth();
  }

  function ancestors(key) { // outermost first, ending with key itself
    const chain = [];
    for (let k = key; k; k = modules.get(k) && modules.get(k).parent) chain.unshift(k);
    return chain;
  }

  // -- folding clusters in place ------------------------------------------------------------
  function render() {
    const wanted = neededDepth();
    const i = pickLayout(wanted);
    const short = DATA.layouts[i].depth < wanted && i + 1 < DATA.layouts.length && !DATA.layouts[i + 1].available;
    showLayout(i);
    const tl = svg.tl;
    tl.overlay.replaceChildren();
    const folded = new Set([...tl.clusters.keys()].filter((key) => !open.has(key)));
    const outer = (chain) => chain.find((key) => folded.has(key));
    for (const [key, g] of tl.clusters) g.style.display = outer(ancestors(key)) ? "none" : "";
    const rep = new Map();
    for (const [title, g] of tl.nodes) {
      const chain = g.dataset.chain ? g.dataset.chain.split("\n") : [];
      const at = outer(chain);
      g.style.display = at ? "none" : "";
      rep.set(title, at || title);
    }
    for (const e of tl.edges) {
      e.g.style.display = rep.get(e.a) === rep.get(e.b) && rep.get(e.a) !== e.a ? "none" : "";
    }
    for (const key of folded) {
      if (outer(ancestors(key)) === key) tl.overlay.appendChild(foldedBox(key, tl.clusters.get(key)));
    }
    highlightSelection();
    runSearch(false);
    if (short) say("this trace is too large to expand that far in one layout (re-export with a larger max_nodes)");
  }

  function foldedBox(key, cluster) {
    const ns = "http://www.w3.org/2000/svg";
    const b = outline(cluster.querySelector("polygon, path"));
    const m = modules.get(key);
    const g = document.createElementNS(ns, "g");
    g.setAttribute("class", "tl-modbox tl-folded");
    g.dataset.module = key;
    const rect = document.createElementNS(ns, "rect");
    for (const [k, v] of Object.entries({ x: b.x, y: b.y, width: b.width, height: b.height, rx: 6 })) {
      rect.setAttribute(k, v);
    }
    g.appendChild(rect);
    const tip = document.createElementNS(ns, "title");
    tip.textContent = key + " (" + m.type + "): " + m.ops.length + " ops, folded; click to open";
    g.appendChild(tip);
    const lines = [key + " (" + m.type + ")", m.ops.length + " ops"];
    lines.forEach((line, n) => {
      const text = document.createElementNS(ns, "text");
      text.setAttribute("x", b.x + b.width / 2);
      text.setAttribute("y", b.y + Math.min(24, b.height / 2) + n * 14);
      text.setAttribute("text-anchor", "middle");
      text.textContent = line;
      g.appendChild(text);
    });
    return g;
  }

  // The frame's bounds from its own coordinates: getBBox() of a hidden element is 0 in some browsers.
  function outline(shape) {
    const xy = (shape.getAttribute("points") || shape.getAttribute("d")).match(/-?[\d.]+(e-?\d+)?/g).map(Number);
    const xs = xy.filter((_, n) => n % 2 === 0);
    const ys = xy.filter((_, n) => n % 2 === 1);
    const x = Math.min(...xs);
    const y = Math.min(...ys);
    return { x, y, width: Math.max(...xs) - x, height: Math.max(...ys) - y };
  }

  function openModule(key) { for (const k of ancestors(key)) open.add(k); render(); }

  // Folding keeps what was open inside, so that opening the module again shows it as it was.
  function foldModule(key) { open.delete(key); render(); }

  function openToDepth(depth) { // every module pass shallower than depth open, the rest boxes
    open.clear();
    for (const m of modules.values()) if (m.depth < depth) open.add(m.key);
    render();
  }

  // -- pan and zoom -------------------------------------------------------------------------
  function setView(v) {
    view = v;
    svg.setAttribute("viewBox", [v.x, v.y, v.w, v.h].join(" "));
  }

  function aspect() { return graph.clientHeight / Math.max(1, graph.clientWidth); }

  function fitWidth() { // a tall graph opens at its top, as wide as the pane but never enlarged; a short one whole
    const f = svg.tl.full;
    if (f.w * aspect() >= f.h) { fitAll(); return; }
    const w = Math.max(f.w, graph.clientWidth);
    setView({ x: f.x - (w - f.w) / 2, y: f.y, w, h: w * aspect() });
  }

  function fitAll() {
    const f = svg.tl.full;
    const w = Math.max(f.w, f.h / aspect());
    setView({ x: f.x, y: f.y, w, h: w * aspect() });
  }

  function toSvg(clientX, clientY) {
    const r = svg.getBoundingClientRect();
    return { x: view.x + (clientX - r.left) / r.width * view.w, y: view.y + (clientY - r.top) / r.height * view.h };
  }

  function centerOn(el) {
    const r = el.getBoundingClientRect();
    const c = toSvg(r.left + r.width / 2, r.top + r.height / 2);
    setView({ x: c.x - view.w / 2, y: c.y - view.h / 2, w: view.w, h: view.h });
  }

  graph.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const p = toSvg(ev.clientX, ev.clientY);
    const k = Math.exp(ev.deltaY * 0.0015);
    setView({ x: p.x - (p.x - view.x) * k, y: p.y - (p.y - view.y) * k, w: view.w * k, h: view.h * k });
  }, { passive: false });

  let drag = null;
  graph.addEventListener("pointerdown", (ev) => { drag = { x: ev.clientX, y: ev.clientY, view, moved: false }; });
  window.addEventListener("pointerup", () => { setTimeout(() => { drag = null; }, 0); });
  window.addEventListener("pointermove", (ev) => {
    if (!drag || !(ev.buttons & 1)) return;
    const r = svg.getBoundingClientRect();
    const dx = (ev.clientX - drag.x) / r.width * drag.view.w;
    const dy = (ev.clientY - drag.y) / r.height * drag.view.h;
    if (Math.abs(ev.clientX - drag.x) + Math.abs(ev.clientY - drag.y) > 3) drag.moved = true;
    setView({ x: drag.view.x - dx, y: drag.view.y - dy, w: drag.view.w, h: drag.view.h });
  });

  // -- clicks and hover ---------------------------------------------------------------------
  graph.addEventListener("click", (ev) => {
    if (drag && drag.moved) return;
    const node = ev.target.closest("[data-op], .tl-modbox, g.cluster");
    if (!node) return;
    if (node.dataset.op !== undefined) select(Number(node.dataset.op), false);
    else if (node.dataset.module) openModule(node.dataset.module);
    else if (node.dataset.cluster) foldModule(node.dataset.cluster);
  });

  graph.addEventListener("mouseover", (ev) => {
    const node = ev.target.closest("g.node");
    if (node) tracePaths(parseTitle(node));
  });
  graph.addEventListener("mouseout", (ev) => {
    if (ev.target.closest("g.node")) for (const el of svg.querySelectorAll(".tl-path")) el.classList.remove("tl-path");
  });

  function tracePaths(title) { // the paths from this node back to the inputs and on to the outputs
    const tl = svg.tl;
    for (const [links, end] of [[tl.up, "a"], [tl.down, "b"]]) {
      const seen = new Set([title]);
      const todo = [title];
      while (todo.length) {
        for (const e of links.get(todo.pop()) || []) {
          e.g.classList.add("tl-path");
          if (!seen.has(e[end])) { seen.add(e[end]); todo.push(e[end]); tl.nodes.get(e[end]).classList.add("tl-path"); }
        }
      }
    }
  }

  // Where an op is drawn now: its own node, else the box (laid out or folded) it is inside.
  function elementOf(index) {
    const node = svg.tl.nodes.get("op " + index);
    if (node && node.style.display !== "none") return node;
    const chain = ops[index].modules;
    for (const key of chain) {
      const box = svg.querySelector('.tl-modbox[data-module="' + CSS.escape(key) + '"]');
      if (box && box.style.display !== "none") return box;
    }
    return null;
  }

  function highlightSelection() {
    for (const el of svg.querySelectorAll(".tl-selected")) el.classList.remove("tl-selected");
    if (selected !== null) { const el = elementOf(selected); if (el) el.classList.add("tl-selected"); }
  }

  // -- search -------------------------------------------------------------------------------
  const search = document.getElementById("tl-search");
  function runSearch(jump) {
    for (const el of svg.querySelectorAll(".tl-match")) el.classList.remove("tl-match");
    const q = search.value.trim().toLowerCase();
    matches = [];
    if (!q) { say(""); return; }
    for (const op of ops) {
      if (op.label.toLowerCase().includes(q) || op.func.toLowerCase().includes(q) ||
          op.modules.some((m) => m.toLowerCase().includes(q))) matches.push(op.index);
    }
    for (const i of matches) { const el = elementOf(i); if (el) el.classList.add("tl-match"); }
    say(matches.length + (matches.length === 1 ? " op matches" : " ops match"));
    if (jump && matches.length) { matchAt = (matchAt + 1) % matches.length; select(matches[matchAt], true); }
  }
  search.addEventListener("input", () => { matchAt = -1; runSearch(false); });
  search.addEventListener("keydown", (ev) => { if (ev.key === "Enter") runSearch(true); });

  function say(text) { status.textContent = text; }

  // -- the op panel -------------------------------------------------------------------------
  function select(index, center) {
    selected = index;
    highlightSelection();
    if (center) { const el = elementOf(index); if (el) centerOn(el); }
    showOp(ops[index]);
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  function shapeText(shape) {
    if (shape === null || shape === undefined) return "-";
    if (shape.length && Array.isArray(shape[0])) return shape.map(shapeText).join(" ");
    return "(" + shape.join(", ") + (shape.length === 1 ? ",)" : ")");
  }

  function si(n, unit) {
    if (n === null || n === undefined) return "unknown";
    for (const [p, s] of [["T", 1e12], ["G", 1e9], ["M", 1e6], ["k", 1e3]]) {
      if (n >= s) return (n / s).toFixed(1) + " " + p + unit;
    }
    return n.toFixed(0) + " " + unit;
  }

  function links(labels) {
    const span = el("span");
    if (!labels.length) span.textContent = "none";
    labels.forEach((label, n) => {
      const a = el("a", label);
      a.href = "#";
      a.className = "tl-link";
      a.addEventListener("click", (ev) => { ev.preventDefault(); select(byLabel.get(label).index, true); });
      if (n) span.append(", ");
      span.append(a);
    });
    return span;
  }

  function showOp(op) {
    panel.replaceChildren();
    panel.append(el("h2", op.label, "tl-op-label"));
    panel.append(el("div", op.kind === "op" ? op.func : op.kind, "tl-op-func"));
    const table = el("table");
    const row = (name, value) => {
      const tr = el("tr");
      tr.append(el("th", name));
      const td = el("td");
      if (value instanceof Node) td.append(value); else td.textContent = value;
      tr.dataset.field = name;
      tr.append(td);
      table.append(tr);
    };
    row("Shape", shapeText(op.shape));
    row("Dtype", op.dtype || "-");
    row("Device", op.device || "-");
    if (op.bytes !== null) row("Size", si(op.bytes, "B"));
    row("Module", op.modules.length ? op.modules[op.modules.length - 1] : "(top level)");
    if (op.modules.length > 1) row("Inside", op.modules.join(" > "));
    if (op.module_outputs.length) row("Output of", op.module_outputs.join(", "));
    for (const p of op.params) {
      row(p.buffer ? "Buffer" : "Param", p.name + " " + shapeText(p.shape) + " (" + p.numel.toLocaleString() +
          (p.buffer ? ")" : p.trainable ? ", trainable)" : ", frozen)"));
    }
    if (op.kind === "op") {
      if (op.source) row("Source", op.source);
      if (op.in_place) row("In place", "yes");
      const config = Object.entries(op.config).map(([k, v]) => k + "=" + v).join(", ");
      if (config) row("Config", config);
      row("FLOPs", si(op.flops, "FLOPs") + (op.macs ? "  (" + si(op.macs, "MACs") + ")" : ""));
      if (op.elapsed !== null) row("Time", op.elapsed >= 1e-3 ? (op.elapsed * 1e3).toFixed(2) + " ms"
        : (op.elapsed * 1e6).toFixed(0) + " us");
      if (op.conditions.length) row("Branch on", links(op.conditions));
    }
    const d = op.distance;
    const range = (lo, hi) => lo === null ? "no path" : lo === hi ? String(lo) : lo + " to " + hi;
    row("From input", range(d[0], d[1]));
    row("To output", range(d[2], d[3]));
    op.code.forEach((c, n) => row(n ? "" : "Code", c[0] + ":" + c[1] + " in " + c[2]));
    row("Parents", links(op.parents));
    row("Children", links(op.children));
    for (const e of op.edits || []) row("Edited", e.site + ": " + e.helpers.join(", "));
    const pair = DATA.comparison && DATA.comparison[op.label];
    if (pair) {
      row("Compared", pair.verdict + (pair.max_abs !== null ? ", max |diff| " + pair.max_abs.toPrecision(3) : "")
          + (pair.relative !== null ? ", relative " + pair.relative.toPrecision(3) : ""));
      row("Counterpart", pair.partner);
    }
    panel.append(table);
    showPicture(op);
  }

  function showPicture(op) {
    if (pictures === null) pictures = JSON.parse(document.getElementById("tl-pictures").textContent);
    const pic = pictures[op.index];
    const box = el("div", undefined, "tl-picture");
    panel.append(box);
    if (!pic) {
      box.append(el("p", op.saved ? "no picture of this value" : "value not saved (save= left it out)", "tl-note"));
      return;
    }
    if (pic.path) box.append(el("p", "output " + pic.path.join("/") + " (the first array)", "tl-note"));
    if (pic.stats) {
      const s = pic.stats;
      box.append(el("p", "min " + s.min.toPrecision(4) + ", max " + s.max.toPrecision(4) + ", mean " +
        s.mean.toPrecision(4) + ", std " + s.std.toPrecision(4) + (pic.nonfinite ? ", " + pic.nonfinite +
        " non-finite" : ""), "tl-stats"));
    }
    if (pic.hist) box.append(histogram(pic.hist));
    if (pic.heatmaps) {
      const h = pic.heatmaps;
      const canvas = el("canvas", undefined, "tl-heatmap");
      const caption = el("p", "", "tl-note");
      const draw = (n) => {
        heatmap(canvas, h, h.slices[n]);
        caption.textContent = "slice " + n + " of " + h.count + " (leading axes " + shapeText(h.lead_shape) +
          "), " + h.of_rows + "x" + h.of_cols + (h.rows < h.of_rows || h.cols < h.of_cols ? " shown as " + h.rows +
          "x" + h.cols + " block means" : "") + "; " + h.slices[n].lo.toPrecision(3) + " to " +
          h.slices[n].hi.toPrecision(3);
      };
      if (h.slices.length > 1) {
        const pick = el("select", undefined, "tl-slice");
        h.slices.forEach((_, n) => pick.append(new Option("slice " + n, n)));
        pick.addEventListener("change", () => draw(Number(pick.value)));
        box.append(pick);
      }
      box.append(canvas, caption);
      draw(0);
    }
  }

  function histogram(hist) {
    const canvas = el("canvas", undefined, "tl-histogram");
    canvas.width = 256;
    canvas.height = 80;
    const c = canvas.getContext("2d");
    const most = Math.max(1, ...hist.counts);
    const w = canvas.width / hist.counts.length;
    c.fillStyle = "#4a6fa5";
    hist.counts.forEach((n, i) => {
      const h = n / most * (canvas.height - 12);
      c.fillRect(i * w, canvas.height - 12 - h, Math.max(1, w - 1), h);
    });
    c.fillStyle = "#333";
    c.font = "10px sans-serif";
    c.fillText(hist.lo.toPrecision(3), 0, canvas.height - 1);
    c.textAlign = "right";
    c.fillText(hist.hi.toPrecision(3), canvas.width, canvas.height - 1);
    return canvas;
  }

  function heatmap(canvas, h, slice) {
    const bytes = Uint8Array.from(atob(slice.data), (ch) => ch.charCodeAt(0));
    const cell = Math.max(1, Math.floor(256 / Math.max(h.rows, h.cols)));
    canvas.width = h.cols * cell;
    canvas.height = h.rows * cell;
    const c = canvas.getContext("2d");
    for (let r = 0; r < h.rows; r++) {
      for (let k = 0; k < h.cols; k++) {
        const v = bytes[r * h.cols + k];
        c.fillStyle = "rgb(" + v + "," + Math.round(v * 0.6 + 40) + "," + (255 - v) + ")";
        c.fillRect(k * cell, r * cell, cell, cell);
      }
    }
  }

  // -- controls -----------------------------------------------------------------------------
  const depthPick = document.getElementById("tl-depth");
  const maxDepth = Math.max(0, ...DATA.modules.map((m) => m.depth));
  for (let d = 1; d <= maxDepth; d++) depthPick.append(new Option("fold at depth " + d, d));
  depthPick.append(new Option("all open", maxDepth + 1));
  depthPick.addEventListener("change", () => openToDepth(Number(depthPick.value)));
  document.getElementById("tl-expand").addEventListener("click", () => {
    depthPick.value = maxDepth + 1; openToDepth(maxDepth + 1);
  });
  document.getElementById("tl-collapse").addEventListener("click", () => { depthPick.value = 1; openToDepth(1); });
  document.getElementById("tl-fit").addEventListener("click", () => fitAll());

  // -- start --------------------------------------------------------------------------------
  const startDepth = DATA.layouts[DATA.start].depth;
  depthPick.value = Math.min(startDepth, maxDepth + 1);
  openToDepth(startDepth);
  if (DATA.focus !== null && byLabel.has(DATA.focus)) select(byLabel.get(DATA.focus).index, true);
  window.torchlensViewer = {
    startedAt: t0, renderedAt: performance.now(), layout: () => DATA.layouts[layoutIndex].depth,
    open: (key) => openModule(key), fold: (key) => foldModule(key), openToDepth,
    center: (index) => { const found = elementOf(index); if (found) centerOn(found); },
  };
})();
