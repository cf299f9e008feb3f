// The TorchLens trace viewer: interaction on top of an SVG graph. No framework, no network.
// Data: #tl-data (every op's label, function, module and parents, as parallel lists; the module passes),
// #tl-layout-N (Graphviz's SVG of layout N, parsed when first shown; small traces only: larger ones are laid
// out here, only the part shown), #tl-ops-K and #tl-pictures-K (the panel's details and value pictures of
// ops K*chunk to (K+1)*chunk - 1, as columns, parsed when one of them is first shown in the panel).
"use strict";
(function () {
  const t0 = performance.now();
  const DATA = JSON.parse(document.getElementById("tl-data").textContent);
  const G = DATA.graph;
  const count = G.label.length;
  const byLabel = new Map(G.label.map((label, i) => [label, i]));
  const edited = new Set(G.edited);
  const moduleList = DATA.modules;
  moduleList.forEach((m, i) => { m.at = i; });
  const modules = new Map(moduleList.map((m) => [m.key, m]));
  const graph = document.getElementById("tl-graph");
  const panel = document.getElementById("tl-panel");
  const status = document.getElementById("tl-status");
  const inPage = DATA.layouts === null; // laid out here, as shown (a large trace)
  const parsed = new Set(); // the ids of the lazily parsed blocks read so far
  const blocks = new Map();
  let layoutIndex = -1;
  let svg = null;
  let view = null; // {x, y, w, h}: the SVG viewBox
  let selected = null; // op index
  let matches = [];
  let matchAt = -1;
  let haystack = null; // per op: label, function and module keys, lower case (built on the first search)
  // The module passes shown open (as clusters); every other module pass is one box.
  const open = new Set();

  function block(id) {
    if (!blocks.has(id)) { blocks.set(id, JSON.parse(document.getElementById(id).textContent)); parsed.add(id); }
    return blocks.get(id);
  }
  // An op's details from its block's columns (data.op_block): strings by position in the block's table, ops
  // by index (a label no op has is a string), the fields most ops leave empty by position in the block.
  function record(index) {
    const found = block("tl-ops-" + Math.floor(index / DATA.chunk));
    const at = index % DATA.chunk;
    const c = found.columns;
    const s = found.strings;
    const text = (i) => i === null ? null : s[i];
    const label = (x) => typeof x === "number" ? G.label[x] : x;
    const op = {
      index, label: G.label[index], kind: G.kind[index], func: G.func[index], shape: found.shapes[c.shape[at]],
      dtype: text(c.dtype[at]), device: text(c.device[at]), bytes: c.bytes[at],
      module_outputs: c.module_outputs[at].map((i) => s[i]), params: found.params[at] || [],
      parents: G.parents[index].map(label), children: childrenOf(index).map(label), saved: c.saved[at] === 1,
      code: found.contexts[c.code[at]].map(([file, line, func]) => [s[file], line, s[func]]), distance: distanceOf(index),
      flops: c.flops[at], macs: c.macs[at], elapsed: c.elapsed[at], source: text(c.source[at]),
      in_place: c.in_place[at] === 1, conditions: c.conditions[at].map(label), config: found.config[at] || {},
    };
    if (found.edits[at]) op.edits = found.edits[at];
    return op;
  }
  // Each op's children, from every op's parents (as the trace links them: in op order, once per use).
  let childLists = null;
  function childrenOf(index) {
    if (childLists === null) {
      childLists = Array.from({ length: count }, () => []);
      G.parents.forEach((parents, j) => { for (const p of parents) childLists[p].push(j); });
    }
    return childLists[index];
  }
  // Shortest and longest paths, in edges, from any input to each op and from each op to any output (null: no
  // path), as trace.distances() works them out: worked out here for every op when the first is shown.
  let distances = null;
  function distanceOf(index) {
    if (distances === null) {
      const [minIn, maxIn, minOut, maxOut] = [0, 1, 2, 3].map(() => new Array(count).fill(null));
      for (let i = 0; i < count; i++) { // ops are in execution order: parents come first
        if (G.kind[i] === "input") { minIn[i] = maxIn[i] = 0; continue; }
        for (const p of G.parents[i]) {
          if (minIn[p] === null) continue;
          if (minIn[i] === null || minIn[p] + 1 < minIn[i]) minIn[i] = minIn[p] + 1;
          if (maxIn[i] === null || maxIn[p] + 1 > maxIn[i]) maxIn[i] = maxIn[p] + 1;
        }
      }
      for (let i = count - 1; i >= 0; i--) {
        if (G.kind[i] === "output") minOut[i] = maxOut[i] = 0;
        if (minOut[i] === null) continue;
        for (const p of G.parents[i]) {
          if (minOut[p] === null || minOut[i] + 1 < minOut[p]) minOut[p] = minOut[i] + 1;
          if (maxOut[p] === null || maxOut[i] + 1 > maxOut[p]) maxOut[p] = maxOut[i] + 1;
        }
      }
      distances = [minIn, maxIn, minOut, maxOut];
    }
    return distances.map((d) => d[index]);
  }
  // An op's value picture from its block's columns (pictures.picture_block), the arrays decoded once a block.
  function pictureOf(index) {
    const found = block("tl-pictures-" + Math.floor(index / DATA.chunk));
    const at = index % DATA.chunk;
    if (found.other[at]) return found.other[at];
    if (!found.rows) decodePictures(found);
    const r = found.rows.get(at);
    if (r === undefined) return undefined;
    const n = found.numbers.subarray(r * 6, r * 6 + 6);
    const pic = {
      nonfinite: found.nonfinite[r],
      hist: { counts: Array.from(found.counts.subarray(r * found.bins, (r + 1) * found.bins)), lo: n[0], hi: n[1] },
      stats: { min: n[2], max: n[3], mean: n[4], std: n[5] },
    };
    const m = found.maps.get(r);
    if (m) {
      const [rows, cols, ofRows, ofCols, count, lead, slices] = found.heads[m.head];
      pic.heatmaps = { rows, cols, of_rows: ofRows, of_cols: ofCols, lead_shape: lead, count, slices: [] };
      for (let k = 0; k < slices; k++) {
        const from = m.pixel + k * rows * cols;
        const data = btoa(String.fromCharCode.apply(null, found.pixels.subarray(from, from + rows * cols)));
        pic.heatmaps.slices.push({ lo: found.ranges[2 * (m.slice + k)], hi: found.ranges[2 * (m.slice + k) + 1], data });
      }
    }
    if (found.paths[r]) pic.path = found.paths[r];
    return pic;
  }
  function decodePictures(found) {
    const bytes = (b64) => Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
    found.rows = new Map(found.at.map((at, r) => [at, r]));
    if (!found.at.length) return;
    const Counts = found.bits === 8 ? Uint8Array : found.bits === 16 ? Uint16Array : Uint32Array;
    found.counts = new Counts(bytes(found.counts).buffer);
    found.bins = found.counts.length / found.at.length;
    found.numbers = new Float64Array(bytes(found.numbers).buffer);
    found.ranges = new Float64Array(bytes(found.ranges).buffer);
    found.pixels = bytes(found.pixels);
    found.maps = new Map(); // row -> its heatmap's header, first slice and first pixel
    let slice = 0;
    let pixel = 0;
    for (const [row, head] of found.heat) {
      const [rows, cols, , , , , slices] = found.heads[head];
      found.maps.set(row, { head, slice, pixel });
      slice += slices;
      pixel += slices * rows * cols;
    }
  }

  const chains = new Array(moduleList.length); // module position -> keys of it and its ancestors, outermost first
  function moduleChain(at) {
    if (at < 0) return [];
    if (!chains[at]) chains[at] = moduleChain(moduleList[at].parent).concat([moduleList[at].key]);
    return chains[at];
  }
  function chainOf(index) { return moduleChain(G.module[index]); }

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
    showSvg(document.getElementById("tl-layout-" + i).textContent);
  }

  // Put an SVG (Graphviz's, or one laid out here) in the pane and index its nodes, clusters and edges by the
  // <title> each has (op 12, module layer1:1, cluster layer1:1, op 3->op 4).
  // `laid` (from layoutInPage) lists the nodes, frames and edges in the order the SVG has them, with the
  // attributes the page needs already in the markup: no <title> is read and no attribute set per element.
  function showSvg(text, laid) {
    graph.innerHTML = text;
    svg = graph.querySelector("svg");
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    const root = svg.querySelector("g.graph");
    const overlay = document.createElementNS("http://www.w3.org/2000/svg", "g");
    overlay.setAttribute("class", "tl-overlay");
    root.appendChild(overlay);
    svg.tl = { root, overlay, nodes: new Map(), clusters: new Map(), boxes: new Map(), edges: [], up: new Map(),
               down: new Map() };
    if (laid) indexLaidOut(laid); else indexGraphviz();
    const box = svg.viewBox.baseVal;
    svg.tl.full = { x: box.x, y: box.y, w: box.width, h: box.height };
    fitWidth();
  }

  function link(a, b, g) {
    const edge = { a, b, g };
    svg.tl.edges.push(edge);
    if (!svg.tl.down.has(a)) svg.tl.down.set(a, []);
    if (!svg.tl.up.has(b)) svg.tl.up.set(b, []);
    svg.tl.down.get(a).push(edge);
    svg.tl.up.get(b).push(edge);
  }

  function indexLaidOut(laid) {
    const tl = svg.tl;
    const byOrder = (selector, list, each) => svg.querySelectorAll(selector).forEach((g, n) => each(list[n], g));
    byOrder("g.node", laid.nodes, (node, g) => {
      tl.nodes.set(node.id, g);
      if (node.kind === "module") tl.boxes.set(moduleList[node.module].key, g);
    });
    byOrder("g.cluster", laid.frames, (frame, g) => tl.clusters.set(frame.key, g));
    byOrder("g.edge", laid.edges, (edge, g) => link(edge[0].id, edge[1].id, g));
  }

  function indexGraphviz() {
    for (const g of svg.querySelectorAll("g.node")) {
      const title = parseTitle(g);
      svg.tl.nodes.set(title, g);
      if (title.startsWith("op ")) {
        const index = Number(title.slice(3));
        g.dataset.op = index;
        g.dataset.chain = chainOf(index).join("\n");
        if (edited.has(index)) g.classList.add("tl-edited");
      } else if (title.startsWith("module ")) {
        const key = title.slice(7);
        g.dataset.module = key;
        g.dataset.chain = ancestors(key).join("\n");
        g.classList.add("tl-modbox");
        svg.tl.boxes.set(key, g);
      }
    }
    for (const g of svg.querySelectorAll("g.cluster")) {
      const key = parseTitle(g).replace(/^cluster /, "");
      g.dataset.cluster = key;
      svg.tl.clusters.set(key, g);
    }
    for (const g of svg.querySelectorAll("g.edge")) {
      const [a, b] = parseTitle(g).split("->");
      link(a, b, g);
    }
  }

  function ancestors(key) { // outermost first, ending with key itself
    return modules.has(key) ? moduleChain(modules.get(key).at) : [key];
  }

  // -- folding clusters in place ------------------------------------------------------------
  // Show the modules in `open` open; false (nothing changed) when that is more nodes than max_nodes.
  function render(focusKey) {
    if (inPage) return renderInPage(focusKey);
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
    tl.folded = new Map();
    for (const key of folded) {
      if (outer(ancestors(key)) === key) {
        const box = foldedBox(key, tl.clusters.get(key));
        tl.folded.set(key, box);
        tl.overlay.appendChild(box);
      }
    }
    highlightSelection();
    runSearch(false);
    if (short) say(TOO_LARGE);
    return true;
  }

  const TOO_LARGE = "this trace is too large to expand that far in one layout (re-export with a larger max_nodes)";

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
    tip.textContent = key + " (" + m.type + "): " + m.ops + " ops, folded; click to open";
    g.appendChild(tip);
    const lines = [key + " (" + m.type + ")", m.ops + " ops"];
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

  function openModule(key) {
    const added = ancestors(key).filter((k) => !open.has(k));
    for (const k of added) open.add(k);
    if (!render(key)) { for (const k of added) open.delete(k); say(TOO_LARGE); }
  }

  // Folding keeps what was open inside, so that opening the module again shows it as it was.
  function foldModule(key) { open.delete(key); render(); }

  function openToDepth(depth) { // every module pass shallower than depth open, the rest boxes
    for (let d = depth; d >= 1; d--) { // laid out here: as deep as max_nodes allows
      open.clear();
      for (const m of moduleList) if (m.depth < d) open.add(m.key);
      if (render()) { if (d < depth) say(TOO_LARGE); return d; }
    }
    return 0;
  }

  // -- laying out in the page (large traces: only what is shown) ----------------------------
  // Each open module pass is a frame whose contents are laid out on their own, in layers from the inputs
  // down (an op's layer is one past its deepest parent's), each layer ordered by its parents' places; a
  // frame is one node of its parent's layout, as large as its contents. Every other module pass is one box,
  // and a pass of one op is that op, as drawings show it. Linear in the ops, plus what is shown.
  const CHAR = 6.2, LINE = 13, GAP_X = 18, GAP_Y = 28, PAD = 10, TITLE = 18;
  const SVGNS = "http://www.w3.org/2000/svg";
  const framed = new Array(moduleList.length); // module position -> positions of the boxable passes around it
  function boxable(at) { // outermost first, itself last
    if (at < 0) return [];
    if (!framed[at]) {
      const outer = boxable(moduleList[at].parent);
      framed[at] = moduleList[at].ops > 1 ? outer.concat([at]) : outer;
    }
    return framed[at];
  }
  function esc(text) { return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;"); }
  function moduleName(m) { return m.path + (m.num_passes > 1 ? ":" + m.pass : ""); }

  function leaf(id, lines, kind, extra) {
    const w = Math.max(60, Math.max(...lines.map((l) => l.length)) * CHAR + 16);
    return Object.assign({ id, lines, kind, w, h: lines.length * LINE + 10, ins: [], x: 0, y: 0 }, extra);
  }

  function opNode(i) {
    const lines = [];
    const at = G.module[i];
    if (at >= 0 && moduleList[at].ops === 1) lines.push(moduleName(moduleList[at]) + " (" + moduleList[at].type + ")");
    lines.push(G.label[i]);
    if (G.func[i]) lines.push(G.func[i]);
    lines.push(G.shape[i]);
    return leaf("op " + i, lines, G.kind[i], { op: i });
  }

  function boxNode(at) {
    const m = moduleList[at];
    return leaf("module " + m.key, [moduleName(m), m.type, m.ops + " ops"], "module", { module: at });
  }

  function layoutInPage() {
    const root = { id: null, children: [], ins: [], level: 0, parent: null, module: -1 };
    const frames = new Map([[-1, root]]);
    const nodes = new Map();
    const frameOf = (at) => { // an open module pass's frame, put in its own frame when first met
      let f = frames.get(at);
      if (!f) {
        const around = boxable(at);
        const parent = frameOf(around.length > 1 ? around[around.length - 2] : -1);
        const m = moduleList[at];
        f = { id: "cluster " + m.key, key: m.key, module: at, children: [], ins: [], parent, level: parent.level + 1,
              x: 0, y: 0 };
        parent.children.push(f);
        frames.set(at, f);
      }
      return f;
    };
    const repOf = new Array(count);
    for (let i = 0; i < count; i++) {
      const around = boxable(G.module[i]);
      let k = 0;
      while (k < around.length && open.has(moduleList[around[k]].key)) k++;
      const id = k < around.length ? "module " + moduleList[around[k]].key : "op " + i;
      let node = nodes.get(id);
      if (!node) {
        node = k < around.length ? boxNode(around[k]) : opNode(i);
        const f = frameOf(k ? around[k - 1] : -1);
        node.n = nodes.size; // a number for the edge set's keys (strings cost a third of a 50,000-op pass)
        node.parent = f;
        node.level = f.level + 1;
        f.children.push(node);
        nodes.set(id, node);
        if (nodes.size > DATA.max_nodes) return null;
      }
      repOf[i] = node;
    }
    // Edges between the nodes shown; each also links, inside the innermost frame holding both ends, the two
    // members of that frame that hold them (what that frame's layout orders by).
    const edges = [];
    const seen = new Set();
    for (let i = 0; i < count; i++) {
      const b = repOf[i];
      for (const p of G.parents[i]) {
        const a = repOf[p];
        const key = a.n * 67108864 + b.n; // exact in a double while both are under 2 ** 26 nodes
        if (a === b || seen.has(key)) continue;
        seen.add(key);
        edges.push([a, b]);
        let x = a, y = b;
        while (x.level > y.level) x = x.parent;
        while (y.level > x.level) y = y.parent;
        while (x.parent !== y.parent) { x = x.parent; y = y.parent; }
        if (x !== y && !y.ins.includes(x)) y.ins.push(x);
      }
    }
    place(root);
    absolute(root, 0, 0);
    const out = [];
    const W = root.w, H = root.h;
    out.push('<svg xmlns="' + SVGNS + '" viewBox="0 0 ' + W.toFixed(1) + " " + H.toFixed(1) + '"><g class="graph" ' +
             'font-family="Helvetica,Arial,sans-serif" font-size="10">');
    for (const [a, b] of edges) emitEdge(a, b, out);
    const frameList = [];
    emitFrames(root, out, frameList); // over the edges: a frame's title stays clickable where an edge passes under
    for (const node of nodes.values()) emitNode(node, out);
    out.push("</g></svg>");
    return { text: out.join(""), nodes: [...nodes.values()], frames: frameList, edges };
  }

  function place(f) { // lays out a frame's members (relative to it); sets its size
    const members = f.children;
    members.forEach((c, n) => { c.order = n; if (c.children) place(c); });
    const rank = new Array(members.length).fill(0);
    const layers = [];
    for (const c of members) {
      for (const p of c.ins) if (p.order < c.order) rank[c.order] = Math.max(rank[c.order], rank[p.order] + 1);
      (layers[rank[c.order]] = layers[rank[c.order]] || []).push(c);
    }
    const top = PAD + (f.parent ? TITLE : 0);
    let y = top, minX = Infinity, maxX = -Infinity;
    for (const layer of layers) {
      if (!layer) continue;
      const wanted = (c) => {
        const above = c.ins.filter((p) => rank[p.order] < rank[c.order]);
        return above.length ? above.reduce((s, p) => s + p.x + p.w / 2, 0) / above.length : null;
      };
      const want = layer.map((c) => [c, wanted(c)]);
      if (want.every(([, w]) => w !== null)) want.sort((u, v) => u[1] - v[1]);
      let right = -Infinity, shift = 0, known = 0;
      for (const [c, w] of want) {
        c.x = w === null ? (right === -Infinity ? 0 : right + GAP_X) : Math.max(w - c.w / 2, right + GAP_X);
        right = c.x + c.w;
        if (w !== null) { shift += w - (c.x + c.w / 2); known++; }
      }
      const height = Math.max(...layer.map((c) => c.h));
      for (const [c] of want) {
        if (known) c.x += shift / known; // centred under its parents on the whole
        c.y = y + (height - c.h) / 2;
        minX = Math.min(minX, c.x);
        maxX = Math.max(maxX, c.x + c.w);
      }
      y += height + GAP_Y;
    }
    for (const c of members) c.x += PAD - minX;
    f.w = Math.max(members.length ? maxX - minX + 2 * PAD : 0, f.key ? f.key.length * CHAR + 40 : 0);
    f.h = y - GAP_Y + PAD;
  }

  function absolute(f, x, y) {
    for (const c of f.children) {
      c.x += x;
      c.y += y;
      if (c.children) absolute(c, c.x, c.y);
    }
  }

  function emitFrames(f, out, list) {
    for (const c of f.children) {
      if (!c.children) continue;
      const m = moduleList[c.module];
      list.push(c);
      out.push('<g class="cluster" data-cluster="' + esc(c.key) + '"><title>' + esc(c.id) + '</title><path fill="none" stroke="#7a869a" ' +
               'stroke-dasharray="5,2" d="M' + c.x.toFixed(1) + "," + c.y.toFixed(1) + "h" + c.w.toFixed(1) + "v" +
               c.h.toFixed(1) + "h" + (-c.w).toFixed(1) + 'z"/><text x="' + (c.x + 8).toFixed(1) + '" y="' + (c.y + 13).toFixed(1) + '">' + esc(moduleName(m) + " (" +
               m.type + ")") + "</text></g>");
      emitFrames(c, out, list);
    }
  }

  function emitEdge(a, b, out) {
    const x1 = a.x + a.w / 2, y1 = a.y + a.h, x2 = b.x + b.w / 2, y2 = b.y - 6;
    const dy = Math.max(20, Math.abs(y2 - y1) / 2);
    const bend = y2 - y1 > 3 * GAP_Y + 2 * LINE * 4 && Math.abs(x2 - x1) < 40 ? 60 : 0; // a long skip: round the side
    out.push('<g class="edge"><title>' + esc(a.id + "->" + b.id) + '</title><path fill="none" stroke="#444444" d="M' +
             x1.toFixed(1) + "," + y1.toFixed(1) + "C" + (x1 + bend).toFixed(1) + "," + (y1 + dy).toFixed(1) + " " +
             (x2 + bend).toFixed(1) + "," + (y2 - dy).toFixed(1) + " " + x2.toFixed(1) + "," + y2.toFixed(1) +
             '"/><polygon fill="#444444" stroke="#444444" points="' + (x2 - 3.5).toFixed(1) + "," + y2.toFixed(1) +
             " " + (x2 + 3.5).toFixed(1) + "," + y2.toFixed(1) + " " + x2.toFixed(1) + "," + (y2 + 6).toFixed(1) +
             '"/></g>');
  }

  function emitNode(n, out) {
    const x = n.x, y = n.y, w = n.w, h = n.h;
    let shape;
    if (n.kind === "module") {
      shape = '<polygon fill="#dde5f6" stroke="#000000" points="' + [x, y, x + w, y, x + w, y + h, x, y + h]
        .map((v) => v.toFixed(1)).join(" ") + '"/><polyline fill="none" stroke="#000000" points="' +
        [x + 4, y - 4, x + w + 4, y - 4, x + w + 4, y + h - 4, x + w, y + h - 4].map((v) => v.toFixed(1)).join(" ") +
        '"/>';
    } else {
      const fill = G.fill[n.op] || (n.kind === "input" ? "#b7e4c7" : n.kind === "output" ? "#f4acb7"
        : G.params[n.op] ? "#eeeeee" : "#ffffff");
      const rounded = n.kind === "op" ? 6 : h / 2;
      const rect = (d) => '<path fill="' + fill + '" stroke="#000000" d="' + roundRect(x - d, y - d, w + 2 * d,
                                                                                      h + 2 * d, rounded + d) + '"/>';
      shape = rect(0) + (G.out[n.op] ? rect(3).replace('fill="' + fill + '"', 'fill="none"') : "");
    }
    const text = n.lines.map((line, k) => '<text text-anchor="middle" x="' + (x + w / 2).toFixed(1) + '" y="' +
      (y + 15 + k * LINE).toFixed(1) + '">' + esc(line) + "</text>").join("");
    const attrs = n.kind === "module" ? ' class="node tl-modbox" data-module="' + esc(moduleList[n.module].key) + '"'
      : ' class="node' + (edited.has(n.op) ? " tl-edited" : "") + '" data-op="' + n.op + '"';
    out.push("<g" + attrs + "><title>" + esc(n.id) + "</title>" + shape + text + "</g>");
  }

  function roundRect(x, y, w, h, r) {
    r = Math.min(r, w / 2, h / 2);
    const f = (v) => v.toFixed(1);
    return "M" + f(x + r) + "," + f(y) + "H" + f(x + w - r) + "A" + f(r) + "," + f(r) + " 0 0 1 " + f(x + w) + "," +
      f(y + r) + "V" + f(y + h - r) + "A" + f(r) + "," + f(r) + " 0 0 1 " + f(x + w - r) + "," + f(y + h) + "H" +
      f(x + r) + "A" + f(r) + "," + f(r) + " 0 0 1 " + f(x) + "," + f(y + h - r) + "V" + f(y + r) + "A" + f(r) + "," +
      f(r) + " 0 0 1 " + f(x + r) + "," + f(y) + "Z";
  }

  let timings = {};
  function renderInPage(focusKey) {
    const start = performance.now();
    const found = layoutInPage();
    if (found === null) return false;
    const laid = performance.now();
    showSvg(found.text, found);
    timings = { layout: laid - start, svg: performance.now() - laid };
    svg.tl.folded = new Map();
    if (focusKey && svg.tl.clusters.has(focusKey)) centerOn(svg.tl.clusters.get(focusKey));
    highlightSelection();
    runSearch(false);
    return true;
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
    for (const key of chainOf(index)) {
      const box = svg.tl.boxes.get(key) || (svg.tl.folded && svg.tl.folded.get(key));
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
    // An index of the text each op is found by, not the page's DOM: one string per op, made once.
    if (haystack === null) {
      haystack = G.label.map((label, i) => (label + "\n" + G.func[i] + "\n" + chainOf(i).join("\n")).toLowerCase());
    }
    for (let i = 0; i < count; i++) if (haystack[i].includes(q)) matches.push(i);
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
    // The blocks come after this script in the file, so that the graph is drawn before the browser has read
    // them: an op chosen before then is shown once they are in.
    if (document.readyState === "loading") {
      document.addEventListener("DOMContentLoaded", () => { if (selected === index) showOp(record(index)); });
    } else {
      showOp(record(index));
    }
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
      a.addEventListener("click", (ev) => { ev.preventDefault(); select(byLabel.get(label), true); });
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
    const chain = chainOf(op.index);
    row("Module", chain.length ? chain[chain.length - 1] : "(top level)");
    if (chain.length > 1) row("Inside", chain.join(" > "));
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
    const pic = pictureOf(op.index);
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
  const maxDepth = DATA.sizes.length - 1;
  for (let d = 1; d <= maxDepth; d++) depthPick.append(new Option("fold at depth " + d, d));
  depthPick.append(new Option("all open", maxDepth + 1));
  depthPick.addEventListener("change", () => openToDepth(Number(depthPick.value)));
  document.getElementById("tl-expand").addEventListener("click", () => {
    depthPick.value = maxDepth + 1; openToDepth(maxDepth + 1);
  });
  document.getElementById("tl-collapse").addEventListener("click", () => { depthPick.value = 1; openToDepth(1); });
  document.getElementById("tl-fit").addEventListener("click", () => fitAll());

  // -- start --------------------------------------------------------------------------------
  depthPick.value = Math.min(DATA.start, maxDepth + 1);
  openToDepth(DATA.start);
  const renderedAt = performance.now();
  if (DATA.focus !== null && byLabel.has(DATA.focus)) select(byLabel.get(DATA.focus), true);
  const api = {
    startedAt: t0, renderedAt, inPage, parsed: () => [...parsed].sort(), timings: () => timings,
    layout: () => inPage ? neededDepth() : DATA.layouts[layoutIndex].depth,
    open: (key) => openModule(key), fold: (key) => foldModule(key), openToDepth,
    center: (index) => { const found = elementOf(index); if (found) centerOn(found); },
    record, picture: pictureOf,
  };
  // Ready once the blocks are in the document too (the panel reads them).
  const ready = () => { window.torchlensViewer = api; };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready); else ready();
})();
