/* progdesc program viewer: lays out and draws a program's view model (see page.py).
   Layered top-to-bottom layout of the visible graph; expanded groups are boxes laid out
   recursively; edges are lifted to the nearest visible item of each end. No library, no network. */
(function () {
  "use strict";
  // a page (a notebook) may hold another copy of this script: page.py puts a hash of the
  // script here, and a copy whose hash differs is replaced
  var VERSION = "__PDV_VERSION__";
  if (window.progdescViewer && window.progdescViewer.version === VERSION) return;
  var SVGNS = "http://www.w3.org/2000/svg";
  var FONT = 12, NODE_H = 28, PAD_X = 14, GROUP_PAD = 12, GROUP_HEAD = 24;
  var GAP_X = 18, GAP_Y = 34, MAX_ROW = 1250, MIN_SCALE = 0.75, MAX_SCALE = 1.1, MAX_SPAN = 60;
  var measureCtx = null, widthCache = new Map();
  // ports: where an edge enters a box (above the child it goes to) or leaves it (below the
  // child it comes from), named after that child
  var IN = "\u0001in:", OUT = "\u0001out:";

  function textWidth(s) {
    var w = widthCache.get(s);
    if (w !== undefined) return w;
    if (!measureCtx) {
      measureCtx = document.createElement("canvas").getContext("2d");
      measureCtx.font = FONT + "px sans-serif";
    }
    w = Math.ceil(measureCtx.measureText(s).width);
    widthCache.set(s, w);
    return w;
  }
  function el(tag, attrs, parent) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, cls, text, parent) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function dims(shape) {
    return shape == null ? "?" : "[" + shape.map(function (d) { return d == null ? "?" : d; }).join(", ") + "]";
  }
  function shapeText(v) {
    if (!v) return "?";
    var s = dims(v.shape);
    return s + " " + (v.dtype || "");
  }

  /* ---- the model, indexed once ---- */
  function Index(model) {
    var self = this;
    this.model = model;
    this.groups = new Map(); this.nodes = new Map();
    this.kids = new Map([["", []]]);          // container id -> child group ids, then node ids
    this.depth = new Map([["", 0]]);
    this.key = new Map();                     // item -> smallest node index inside it
    model.groups.forEach(function (g) { self.groups.set(g.id, g); self.kids.set(g.id, []); });
    model.groups.forEach(function (g) {
      var p = g.parent && self.groups.has(g.parent) ? g.parent : "";
      g._parent = p; self.kids.get(p).push(g.id);
    });
    var visit = function (id, d) {
      self.kids.get(id).forEach(function (c) { self.depth.set(c, d + 1); visit(c, d + 1); });
    };
    visit("", 0);
    model.groups.forEach(function (g) {   // a group in a cycle of parents (a broken model): a root
      if (self.depth.has(g.id)) return;
      var sibs = self.kids.get(g._parent);
      sibs.splice(sibs.indexOf(g.id), 1);
      g._parent = ""; self.kids.get("").push(g.id); self.depth.set(g.id, 1);
      visit(g.id, 1);
    });
    model.nodes.forEach(function (n, i) {
      var p = n.group && self.groups.has(n.group) ? n.group : "";
      n._parent = p; self.nodes.set(n.id, n); self.kids.get(p).push(n.id);
      self.depth.set(n.id, self.depth.get(p) + 1);
      self.key.set(n.id, i);
      for (var q = p; q; q = self.groups.get(q)._parent) {
        if (!(self.key.get(q) <= i)) self.key.set(q, i);
      }
    });
    // a sub-block hangs below the op that owns it (cond, while, scan): a dashed link lays it out
    this.links = model.edges.slice();
    model.groups.forEach(function (g) {
      if (g.owner && self.nodes.has(g.owner)) self.links.push({ src: g.owner, dst: g.id, var: "", own: true });
    });
    this.producer = new Map(); this.consumer = new Map();
    model.nodes.forEach(function (n) {
      if (n.kind === "data") { self.producer.set(n.var, n.id); return; }
      var first = function (map, slots) {   // the first op that writes (reads) each variable
        (slots || []).forEach(function (s) { s[1].forEach(function (v) { if (!map.has(v)) map.set(v, n.id); }); });
      };
      first(self.producer, n.outputs); first(self.consumer, n.inputs);
    });
  }
  Index.prototype.parentOf = function (id) {
    var n = this.nodes.get(id);
    return n ? n._parent : this.groups.get(id)._parent;
  };

  /* ---- one viewer ---- */
  function Viewer(root, model) {
    this.root = root; this.ix = new Index(model); this.collapsed = new Map();
    var self = this;
    model.groups.forEach(function (g) { self.collapsed.set(g.id, !!g.collapsed); });
    this.view = { x: 0, y: 0, s: 1 }; this.selected = null; this.pos = new Map();
    this.build();
    this.relayout();
    this.fit();
    this.watchSize();
  }

  Viewer.prototype.watchSize = function () {
    // a notebook output may be laid out (or resized) after the script ran: fit once it has a
    // width, and draw what a wider view reaches
    var self = this, last = this.svg.clientWidth;
    if (!window.ResizeObserver) return;
    new ResizeObserver(function () {
      var w = self.svg.clientWidth;
      if (w === last) return;
      var before = last; last = w;
      if (!before) self.fit(); else self.applyView();
    }).observe(this.svg);
  };

  Viewer.prototype.build = function () {
    var self = this, root = this.root, uid = root.id;
    root.querySelectorAll(".pdv-bar, .pdv-stage, .pdv-fallback").forEach(function (e) { e.remove(); });
    var bar = h("div", "pdv-bar", null, root);
    h("span", "pdv-title", this.ix.model.title || "program", bar);
    var sw = h("span", "pdv-searchwrap", null, bar);
    this.search = h("input", "pdv-search", null, sw);
    this.search.type = "search"; this.search.placeholder = "search ops, types, variables";
    this.results = h("ul", "pdv-results", null, sw);
    this.results.hidden = true;
    var btn = function (cls, text, title, fn) {
      var b = h("button", cls, text, bar); b.type = "button"; b.title = title;
      b.addEventListener("click", fn); return b;
    };
    btn("pdv-zoom-in", "+", "zoom in", function () { self.zoomBy(1.25); });
    btn("pdv-zoom-out", "\u2212", "zoom out", function () { self.zoomBy(0.8); });
    btn("pdv-fit", "fit", "fit to width", function () { self.fit(); });
    btn("pdv-expand-all", "expand all", "expand every group", function () { self.expandAll(); });
    btn("pdv-collapse-all", "collapse all", "fold every group", function () { self.collapseAll(); });
    var stage = this.stage = h("div", "pdv-stage", null, root);
    if (!root.style.getPropertyValue("--pdv-height")) stage.style.height = "240px";   // grows to fit
    this.svg = el("svg", { "class": "pdv-canvas" }, stage);
    var defs = el("defs", {}, this.svg);
    var m = el("marker", { id: uid + "-arrow", viewBox: "0 0 10 10", refX: "10", refY: "5",
      markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" }, defs);
    el("path", { d: "M0,0 L10,5 L0,10 z", "class": "pdv-arrowhead" }, m);
    this.vp = el("g", { "class": "pdv-viewport" }, this.svg);
    this.panel = h("div", "pdv-panel", null, stage);
    this.panel.hidden = true;
    this.search.addEventListener("input", function () { self.showResults(self.search.value); });
    this.search.addEventListener("keydown", function (e) {
      if (e.key === "Enter") { var f = self.results.querySelector("li"); if (f) f.click(); }
      if (e.key === "Escape") { self.results.hidden = true; }
    });
    root.addEventListener("keydown", function (e) {
      if (e.key === "Escape" && e.target !== self.search) self.panel.hidden = true;
    });
    this.bindPointer();
  };

  /* ---- visibility and lifted edges ---- */
  Viewer.prototype.visibleItem = function (id) {
    // the outermost collapsed group holding `id`, or `id` itself
    var rep = id, ix = this.ix;
    for (var p = ix.parentOf(id); p; p = ix.groups.get(p)._parent) {
      if (this.collapsed.get(p)) rep = p;
    }
    return rep;
  };
  Viewer.prototype.computeVisible = function () {
    var self = this, ix = this.ix, rep = new Map(), items = [];
    var walk = function (c) {
      ix.kids.get(c).forEach(function (k) {
        items.push(k); rep.set(k, k);
        if (ix.groups.has(k) && !self.collapsed.get(k)) walk(k);
      });
    };
    walk("");
    this.items = items;
    this.rep = function (id) { return rep.has(id) ? id : self.visibleItem(id); };
    // edges: lifted, deduped; per container the edges between its children for layering
    var drawn = new Map(), inner = new Map();
    ix.links.forEach(function (e) {
      if (!ix.depth.has(e.src) || !ix.depth.has(e.dst)) return;
      var a = self.rep(e.src), b = self.rep(e.dst);
      if (a === b) return;
      var ca = a, cb = b, da = ix.depth.get(a), db = ix.depth.get(b);
      while (da > db) { ca = ix.parentOf(ca); da--; }
      while (db > da) { cb = ix.parentOf(cb); db--; }
      if (ca === cb) return;  // one end inside the other (a group and its own op): nothing to draw
      while (ix.parentOf(ca) !== ix.parentOf(cb)) { ca = ix.parentOf(ca); cb = ix.parentOf(cb); }
      var box = ix.parentOf(ca);
      // the edge's legs, one per box it crosses: out of each open box around a (to the box's
      // exit port), across the common box, into each open box around b (from its entry port);
      // edges between regions are drawn once, region to region
      var legs = [], x;
      if (box !== "") for (x = a; x !== ca; x = ix.parentOf(x)) legs.push([ix.parentOf(x), x, OUT + x]);
      legs.push([box, ca, cb]);
      var into = [];
      if (box !== "") for (x = b; x !== cb; x = ix.parentOf(x)) into.push([ix.parentOf(x), IN + x, x]);
      legs = legs.concat(into.reverse());
      legs.forEach(function (l) {
        l.push(l.join("\n"));
        if (!inner.has(l[0])) inner.set(l[0], new Map());
        inner.get(l[0]).set(l[3], [l[1], l[2]]);
      });
      var key = (e.own ? "own\n" : "") + (box === "" ? ca + "\n" + cb : a + "\n" + b);
      var d = drawn.get(key);
      if (d) { if (d.vars.indexOf(e.var) < 0 && d.vars.length < 8) d.vars.push(e.var); }
      else drawn.set(key, box === "" ? { a: ca, b: cb, vars: [e.var], legs: legs, own: e.own }
                                     : { a: a, b: b, vars: [e.var], legs: legs, own: e.own });
    });
    this.edges = Array.from(drawn.values());
    this.inner = inner;
  };

  /* ---- layout ---- */
  Viewer.prototype.itemSize = function (id) {
    var ix = this.ix, g = ix.groups.get(id);
    if (!g) {
      var n = ix.nodes.get(id);
      return { w: Math.max(44, textWidth(n.label) + 2 * PAD_X), h: NODE_H };
    }
    return { w: Math.max(60, textWidth(this.groupText(g)) + 2 * PAD_X + 14), h: NODE_H + 6 };
  };
  Viewer.prototype.groupText = function (g) {
    return g.label + (g.ops ? "  (" + g.ops + " ops)" : "");
  };
  Viewer.prototype.layoutBox = function (c) {
    // lays out container c's children; returns its size and sets this.rel for each child
    var self = this, ix = this.ix, kids = ix.kids.get(c), sizes = new Map();
    kids.forEach(function (k) {
      sizes.set(k, ix.groups.has(k) && !self.collapsed.get(k) ? self.layoutBox(k) : self.itemSize(k));
    });
    var sorted = kids.slice().sort(function (a, b) { return ix.key.get(a) - ix.key.get(b); });
    var preds = new Map(), succs = new Map();
    sorted.forEach(function (k) { preds.set(k, []); succs.set(k, []); });
    var es = this.inner.get(c);
    var isPort = function (id) { return id.charAt(0) === "\u0001"; };
    if (es) es.forEach(function (e) {
      var a = e[0], b = e[1];
      if (isPort(a) || isPort(b)) return;
      if (ix.key.get(a) > ix.key.get(b)) { var t = a; a = b; b = t; }  // program order breaks cycles
      preds.get(b).push(a); succs.get(a).push(b);
    });
    var layer = new Map(), layers = [];
    sorted.forEach(function (k) {
      var l = 0;
      preds.get(k).forEach(function (p) { l = Math.max(l, layer.get(p) + 1); });
      layer.set(k, l);
    });
    sorted.forEach(function (k) {   // a source sits just above its first consumer
      if (preds.get(k).length || !succs.get(k).length) return;
      var l = Infinity;
      succs.get(k).forEach(function (q) { l = Math.min(l, layer.get(q) - 1); });
      layer.set(k, Math.max(0, l));
    });
    // a layer wider than MAX_ROW becomes several, one under the other (the later layers move
    // down), so that edges to its lower rows run through placeholders, not across the upper ones
    var byLayer = [];
    sorted.forEach(function (k) { var l = layer.get(k); (byLayer[l] = byLayer[l] || []).push(k); });
    var moved = 0;
    byLayer.forEach(function (L) {
      if (!L) return;
      var w = 0, sub = 0;
      L.forEach(function (k) {
        var kw = sizes.get(k).w + GAP_X;
        if (w && w + kw > MAX_ROW) { sub++; w = 0; }
        w += kw;
        layer.set(k, layer.get(k) + moved + sub);
      });
      moved += sub;
    });
    // an edge across several layers runs through a thin placeholder in each layer between;
    // one entering the box comes from its top (the entry port), one leaving goes to its bottom
    var dummies = [], chains = this.chains, last = -1, ins = [], outs = [], budget = 2 * kids.length + 100;
    sorted.forEach(function (k) { last = Math.max(last, layer.get(k)); });
    if (es) es.forEach(function (e) {
      var a = e[0], b = e[1], into = isPort(a), out = isPort(b);
      var la = into ? -1 : layer.get(a), lb = out ? last + 1 : layer.get(b);
      var ids = [], prev = into ? null : a;
      chains.set(c + "\n" + a + "\n" + b, ids);
      if (into) ins.push([a, ids, b]); else if (out) outs.push([b, ids, a]);
      if (!into && !out && (ix.key.get(a) > ix.key.get(b) || lb - la < 2)) return;
      // a flat graph of thousands of ops has edges across thousands of layers: placeholders
      // for all of them would be quadratic, so past a budget long edges are drawn directly
      if (lb - la > MAX_SPAN || dummies.length + lb - la > budget) return;
      if (!into && !out) {
        preds.set(b, preds.get(b).filter(function (p) { return p !== a; }));
        succs.set(a, succs.get(a).filter(function (q) { return q !== b; }));
      }
      for (var l = la + 1; l < lb; l++) {
        var d = "\u0000" + (self.nDummies++);
        layer.set(d, l); sizes.set(d, { w: 6, h: NODE_H }); preds.set(d, prev ? [prev] : []); succs.set(d, []);
        if (prev) succs.get(prev).push(d);
        ids.push(d); dummies.push(d); prev = d;
      }
      if (!out && prev) { preds.get(b).push(prev); succs.get(prev).push(b); }
    });
    sorted.concat(dummies).forEach(function (k) { var l = layer.get(k); (layers[l] = layers[l] || []).push(k); });
    layers = layers.filter(Boolean);
    var rank = new Map();
    var setRanks = function (L) { L.forEach(function (k, i) { rank.set(k, i); }); };
    layers.forEach(setRanks);
    var bary = function (L, nb) {
      var val = new Map();
      L.forEach(function (k) {
        var ns = nb.get(k), s = 0;
        ns.forEach(function (n) { s += rank.get(n); });
        val.set(k, ns.length ? s / ns.length : rank.get(k));
      });
      L.sort(function (a, b) { return val.get(a) - val.get(b); });
      setRanks(L);
    };
    for (var sweep = 0; sweep < 4; sweep++) {
      if (sweep % 2 === 0) for (var i = 1; i < layers.length; i++) bary(layers[i], preds);
      else for (var j = layers.length - 2; j >= 0; j--) bary(layers[j], succs);
    }
    // coordinates: layers top to bottom, each packed left to right near its predecessors
    var cx = new Map(), rel = this.rel, y = 0, minX = Infinity, maxX = -Infinity;
    layers.forEach(function (R) {
      var rh = 0, want = [], right = -Infinity;
      R.forEach(function (k) {
        var ps = preds.get(k), s = 0, n = 0;
        ps.forEach(function (p) { if (cx.has(p)) { s += cx.get(p); n++; } });
        want.push(n ? s / n : null);
        rh = Math.max(rh, sizes.get(k).h);
      });
      // pack left to right at the wished centres, then centre the run on its wishes
      var xs = [], shift = 0, nw = 0;
      R.forEach(function (k, i) {
        var w = sizes.get(k).w, x = want[i] == null ? right + GAP_X : want[i] - w / 2;
        if (right === -Infinity && want[i] == null) x = 0;
        x = Math.max(x, right + GAP_X);
        xs.push(x); right = x + w;
        if (want[i] != null) { shift += want[i] - (x + w / 2); nw++; }
      });
      shift = nw ? shift / nw : 0;
      R.forEach(function (k, i) {
        var s = sizes.get(k), x = xs[i] + (shift > 0 ? shift : 0);
        if (k.charAt(0) === "\u0000") rel.set(k, { x: x, y: y, w: s.w, h: rh });   // a placeholder: the row's height
        else rel.set(k, { x: x, y: y + (rh - s.h) / 2, w: s.w, h: s.h, rt: y, rb: y + rh });
        cx.set(k, x + s.w / 2);
        minX = Math.min(minX, x); maxX = Math.max(maxX, x + s.w);
      });
      y += rh + GAP_Y;
    });
    if (!kids.length) { minX = 0; maxX = 60; y = GAP_Y + 10; }
    kids.concat(dummies).forEach(function (k) { rel.get(k).x -= minX; });
    // ports: at the box's top and bottom edge, above and below the legs they feed
    var ports = [], height = y - GAP_Y;
    var port = function (l, first, py) {
      var ids = l[1], r = rel.get(ids.length ? ids[first ? 0 : ids.length - 1] : l[2]);
      rel.set(l[0], { x: r.x + r.w / 2, y: py, w: 0, h: 0 });
      ports.push(l[0]);
    };
    ins.forEach(function (l) { port(l, true, -GROUP_HEAD); });
    outs.forEach(function (l) { port(l, false, height + GROUP_PAD); });
    this.dummiesOf.set(c, dummies.concat(ports));
    var pad = c === "" ? 0 : GROUP_PAD;
    var size = { w: Math.max(maxX - minX + 2 * pad, c === "" ? 0 : this.itemSize(c).w),
                 h: y - GAP_Y + (c === "" ? 0 : GROUP_HEAD + GROUP_PAD) };
    this.inset.set(c, { x: pad, y: c === "" ? 0 : GROUP_HEAD });
    return size;
  };
  Viewer.prototype.relayout = function () {
    var t0 = performance.now(), self = this, ix = this.ix;
    this.computeVisible();
    this.rel = new Map(); this.inset = new Map();
    this.chains = new Map(); this.dummiesOf = new Map(); this.nDummies = 0;
    this.size = this.layoutBox("");
    var pos = new Map();
    var place = function (c, ox, oy) {
      var ins = self.inset.get(c);
      self.dummiesOf.get(c).forEach(function (d) {
        var r = self.rel.get(d);
        pos.set(d, { x: ox + ins.x + r.x, y: oy + ins.y + r.y, w: r.w, h: r.h });
      });
      ix.kids.get(c).forEach(function (k) {
        var r = self.rel.get(k), p = { x: ox + ins.x + r.x, y: oy + ins.y + r.y, w: r.w, h: r.h,
          rt: oy + ins.y + r.rt, rb: oy + ins.y + r.rb };   // and the top and bottom of its row
        pos.set(k, p);
        if (ix.groups.has(k) && !self.collapsed.get(k)) place(k, p.x, p.y);
      });
    };
    place("", 0, 0);
    this.pos = pos;
    this.drawn = null;   // the next applyView draws
    this.lastLayoutMs = performance.now() - t0;
  };

  /* ---- drawing: only what lies in (or near) the view is in the DOM ---- */
  Viewer.prototype.window = function (extra) {
    // the part of the graph the view shows, in graph coordinates, widened by `extra` views
    var v = this.view, W = this.svg.clientWidth || 1000, H = this.svg.clientHeight || 800;
    var x0 = -v.x / v.s, y0 = -v.y / v.s, w = W / v.s, hh = H / v.s;
    return { x0: x0 - extra * w, y0: y0 - extra * hh, x1: x0 + w + extra * w, y1: y0 + hh + extra * hh };
  };
  function meets(r, x0, y0, x1, y1) {
    return x1 >= r.x0 && x0 <= r.x1 && y1 >= r.y0 && y0 <= r.y1;
  }
  Viewer.prototype.draw = function () {
    var self = this, ix = this.ix, pos = this.pos, frag = document.createDocumentFragment();
    var win = this.window(1), labels = this.view.s * FONT >= 3;
    this.drawn = win; this.drawnLabels = labels;
    var boxes = el("g", { "class": "pdv-boxes" }, frag);
    var edges = el("g", { "class": "pdv-edges" }, frag);
    var nodes = el("g", { "class": "pdv-nodes" }, frag);
    this.nodeEls = new Map();
    this.items.forEach(function (id) {
      var p = pos.get(id), g = ix.groups.get(id);
      if (!meets(win, p.x, p.y, p.x + p.w, p.y + p.h)) return;
      if (g && !self.collapsed.get(id)) {
        var b = el("g", { "class": "pdv-group pdv-r-" + g.region + " pdv-k-" + g.kind +
          (id === self.selected ? " pdv-selected" : ""), "data-id": id }, boxes);
        self.nodeEls.set(id, b);
        el("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: 6 }, b);
        var lab = el("g", { "class": "pdv-group-label", "data-id": id }, b);
        el("rect", { x: p.x, y: p.y, width: Math.min(p.w, textWidth(g.label) + 30), height: GROUP_HEAD - 4, rx: 6 }, lab);
        if (labels) el("text", { x: p.x + 8, y: p.y + 15 }, lab).textContent = "\u2212 " + g.label;
        return;
      }
      var cls = "pdv-node", label;
      if (g) { cls += " pdv-collapsed pdv-r-" + g.region + " pdv-k-" + g.kind; label = "+ " + self.groupText(g); }
      else {
        var n = ix.nodes.get(id);
        cls += " pdv-" + n.kind + " pdv-r-" + n.region + (n.forward ? " pdv-grad" : "");
        label = n.label;
      }
      if (id === self.selected) cls += " pdv-selected";
      var ng = el("g", { "class": cls, "data-id": id }, nodes);
      el("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: g ? 4 : (ix.nodes.get(id).kind === "data" ? p.h / 2 : 3) }, ng);
      if (labels) el("text", { x: p.x + p.w / 2, y: p.y + p.h / 2 + 4, "text-anchor": "middle" }, ng).textContent = label;
      self.nodeEls.set(id, ng);
    });
    var arrow = "url(#" + this.root.id + "-arrow)";
    this.edges.forEach(function (e) {
      var a = pos.get(e.a), b = pos.get(e.b);
      if (!a || !b) return;
      var x1 = a.x + a.w / 2, y1 = a.y + a.h, x2 = b.x + b.w / 2, y2 = b.y, d;
      if (y2 > y1) {
        // through the legs' ports and placeholders: a curve to the top of each, straight down it
        // (an edge leaves its row straight down and enters the next straight down: a node lower
        // than its row's tallest item would otherwise have curves through that item)
        var pts = [[x1, y1, Math.max(y1, a.rb || y1)]], lo = Math.min(x1, x2), hi = Math.max(x1, x2);
        var via = function (id) {
          var q = pos.get(id), x = q.x + q.w / 2;
          pts.push([x, q.y, q.y + q.h]); lo = Math.min(lo, x); hi = Math.max(hi, x);
        };
        e.legs.forEach(function (l) {
          if (l[1].charAt(0) === "\u0001") via(l[1]);
          (self.chains.get(l[3]) || []).forEach(via);
          if (l[2].charAt(0) === "\u0001") via(l[2]);
        });
        pts.push([x2, Math.min(y2, b.rt == null ? y2 : b.rt), y2]);
        if (!meets(win, lo, y1, hi, y2)) return;
        d = "M" + x1 + "," + y1 + (pts[0][2] > y1 ? " L" + x1 + "," + pts[0][2] : "");
        for (var i = 1; i < pts.length; i++) {
          var p0 = pts[i - 1], p1 = pts[i], m = (p1[1] - p0[2]) / 2;
          d += " C" + p0[0] + "," + (p0[2] + m) + " " + p1[0] + "," + (p1[1] - m) + " " + p1[0] + "," + p1[1];
          if (p1[2] > p1[1]) d += " L" + p1[0] + "," + p1[2];
        }
      } else {   // upward (a cycle broken by program order): a loop out to the right
        if (!meets(win, Math.min(a.x, b.x), Math.min(a.y, b.y), Math.max(a.x + a.w, b.x + b.w) + 40,
                   Math.max(a.y + a.h, b.y + b.h))) return;
        var xr = Math.max(a.x + a.w, b.x + b.w) + 30;
        var ya = a.y + a.h / 2, yb = b.y + b.h / 2;
        d = "M" + (a.x + a.w) + "," + ya + " C" + xr + "," + ya + " " + xr + "," + yb + " " + (b.x + b.w) + "," + yb;
      }
      if (e.own) { el("path", { d: d, "class": "pdv-own" }, edges); return; }
      var path = el("path", { d: d, "marker-end": arrow, "class": y2 > y1 ? "" : "pdv-back" }, edges);
      el("title", {}, path).textContent = e.vars.join(", ");
    });
    this.vp.textContent = "";
    this.vp.appendChild(frag);
    this.setTransform();
  };

  /* ---- view: pan and zoom ---- */
  Viewer.prototype.setTransform = function () {
    var v = this.view;
    this.vp.setAttribute("transform", "translate(" + v.x + "," + v.y + ") scale(" + v.s + ")");
  };
  Viewer.prototype.fitHeight = function () {
    // in a notebook (no height set by the page) the canvas is as tall as the drawing, 240 to 640 px
    if (this.root.style.getPropertyValue("--pdv-height")) return;
    var want = Math.round(Math.max(240, Math.min(640, this.size.h * this.view.s + 40)));
    if (this.stage.offsetHeight < want) this.stage.style.height = want + "px";
  };
  Viewer.prototype.applyView = function () {
    // moves the drawing; redraws when the view leaves what was drawn or the zoom changed a lot
    var self = this, w = this.window(0), d = this.drawn;
    if (!d) { this.draw(); return; }
    this.setTransform();
    var stale = !d || w.x0 < d.x0 || w.y0 < d.y0 || w.x1 > d.x1 || w.y1 > d.y1 ||
      (d.x1 - d.x0) > 6 * (w.x1 - w.x0) || (this.view.s * FONT >= 3) !== this.drawnLabels;
    if (stale && !this.pending) {
      this.pending = true;
      requestAnimationFrame(function () { self.pending = false; self.draw(); });
    }
  };
  Viewer.prototype.fit = function () {
    var W = this.svg.clientWidth || 800, margin = 16;
    var s = (W - 2 * margin) / Math.max(1, this.size.w);
    s = Math.max(MIN_SCALE, Math.min(MAX_SCALE, s));
    this.view.s = s;
    this.view.x = Math.max(margin, (W - this.size.w * s) / 2);
    if (this.size.w * s > W - 2 * margin) this.view.x = margin;
    this.view.y = margin;
    this.fitHeight();
    this.applyView();
  };
  Viewer.prototype.zoomBy = function (f, cx, cy) {
    var v = this.view, W = this.svg.clientWidth, H = this.svg.clientHeight;
    if (cx == null) { cx = W / 2; cy = H / 2; }
    var s = Math.max(0.05, Math.min(4, v.s * f));
    v.x = cx - (cx - v.x) * s / v.s; v.y = cy - (cy - v.y) * s / v.s; v.s = s;
    this.applyView();
  };
  Viewer.prototype.centre = function (id) {
    var p = this.pos.get(id);
    if (!p) return;
    var v = this.view, W = this.svg.clientWidth, H = this.svg.clientHeight;
    if (v.s < MIN_SCALE) v.s = MIN_SCALE;
    var panelW = this.panel.hidden ? 0 : this.panel.offsetWidth;
    v.x = (W - panelW) / 2 - (p.x + p.w / 2) * v.s;
    v.y = H / 2 - (p.y + p.h / 2) * v.s;
    this.applyView();
  };
  Viewer.prototype.bindPointer = function () {
    var self = this, svg = this.svg, drag = null;
    svg.addEventListener("pointerdown", function (e) {
      self.results.hidden = true;
      if (e.button !== 0) return;
      drag = { x: e.clientX, y: e.clientY, vx: self.view.x, vy: self.view.y, moved: false };
    });
    svg.addEventListener("pointermove", function (e) {
      if (!drag) return;
      var dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
      if (!drag.moved) { drag.moved = true; svg.setPointerCapture(e.pointerId); svg.classList.add("pdv-dragging"); }
      self.view.x = drag.vx + dx; self.view.y = drag.vy + dy; self.applyView();
    });
    var end = function () { svg.classList.remove("pdv-dragging"); setTimeout(function () { drag = null; }, 0); };
    svg.addEventListener("pointerup", end);
    svg.addEventListener("pointercancel", end);
    svg.addEventListener("click", function (e) {
      if (drag && drag.moved) return;
      var lab = e.target.closest(".pdv-group-label");
      if (lab) { self.collapse(lab.getAttribute("data-id")); return; }
      var n = e.target.closest(".pdv-node");
      if (!n) return;
      var id = n.getAttribute("data-id");
      if (self.ix.groups.has(id)) self.expand(id); else self.select(id, false);
    });
    svg.addEventListener("wheel", function (e) {
      e.preventDefault();
      var r = svg.getBoundingClientRect();
      self.zoomBy(Math.exp(-e.deltaY * (e.ctrlKey ? 0.01 : 0.002)), e.clientX - r.left, e.clientY - r.top);
    }, { passive: false });
  };

  /* ---- expand, collapse, select ---- */
  Viewer.prototype.keepInPlace = function (id, fn) {
    // runs fn (which changes the layout) and pans so that item `id` stays where it was on screen
    var before = this.pos.get(id);
    fn();
    var after = this.pos.get(id);
    if (before && after) {
      this.view.x += (before.x - after.x) * this.view.s; this.view.y += (before.y - after.y) * this.view.s;
    }
    this.fitHeight();
    this.applyView();
  };
  Viewer.prototype.expand = function (id) {
    var self = this;
    if (!this.ix.groups.has(id)) throw new Error("no group " + id);
    this.keepInPlace(id, function () { self.collapsed.set(id, false); self.relayout(); });
  };
  Viewer.prototype.collapse = function (id) {
    var self = this;
    if (!this.ix.groups.has(id)) throw new Error("no group " + id);
    this.keepInPlace(id, function () { self.collapsed.set(id, true); self.relayout(); });
  };
  Viewer.prototype.expandAll = function () {
    var self = this;
    this.ix.groups.forEach(function (g, id) { self.collapsed.set(id, false); });
    this.relayout(); this.fit();
  };
  Viewer.prototype.collapseAll = function () {
    var self = this;
    this.ix.groups.forEach(function (g, id) { self.collapsed.set(id, true); });
    this.relayout(); this.fit();
  };
  Viewer.prototype.reveal = function (id) {
    var changed = false;
    for (var p = this.ix.parentOf(id); p; p = this.ix.groups.get(p)._parent) {
      if (this.collapsed.get(p)) { this.collapsed.set(p, false); changed = true; }
    }
    if (changed) this.relayout();
  };
  Viewer.prototype.select = function (id, centre, variable) {
    var ix = this.ix;
    if (!ix.nodes.has(id) && !ix.groups.has(id)) throw new Error("no node or group " + id);
    this.reveal(id);
    if (!this.drawn) this.applyView();
    if (this.selected && this.nodeEls.has(this.selected)) this.nodeEls.get(this.selected).classList.remove("pdv-selected");
    this.selected = id;
    if (this.nodeEls.has(id)) this.nodeEls.get(id).classList.add("pdv-selected");
    this.showPanel(id, variable);
    if (centre !== false) this.centre(id); else this.unhide(id);
  };
  Viewer.prototype.unhide = function (id) {
    // pans sideways when the panel covers item `id`
    var p = this.pos.get(id), v = this.view, free = this.svg.clientWidth - this.panel.offsetWidth - 16;
    if (!p || this.panel.hidden) return;
    var left = v.x + p.x * v.s, right = left + p.w * v.s;
    if (right > free || left < 0) { v.x += free / 2 - (left + right) / 2; this.applyView(); }
  };
  Viewer.prototype.visibleIds = function () {
    // the nodes and folded groups the layout shows (drawn when the view reaches them)
    var self = this;
    return this.items.filter(function (id) { return !self.ix.groups.has(id) || self.collapsed.get(id); });
  };
  Viewer.prototype.drawnIds = function () { return Array.from(this.nodeEls.keys()); };

  /* ---- side panel ---- */
  Viewer.prototype.showPanel = function (id, variable) {
    var self = this, ix = this.ix, P = this.panel, vars = ix.model.vars || {};
    P.textContent = "";
    var close = h("button", "pdv-close", "\u00d7", P); close.type = "button"; close.title = "close";
    close.addEventListener("click", function () { P.hidden = true; });
    var row = function (k, v, parent) {
      var r = h("div", "pdv-row", null, parent || P);
      h("span", "pdv-key", k, r);
      var val = h("span", "pdv-val", null, r);
      if (v instanceof Node) val.appendChild(v); else val.textContent = v;
      return r;
    };
    var link = function (text, target, cls) {
      var a = h("a", cls || "pdv-link", text); a.href = "#";
      a.addEventListener("click", function (e) { e.preventDefault(); self.select(target); });
      return a;
    };
    var g = ix.groups.get(id);
    if (g) {
      h("div", "pdv-ptitle", g.label, P);
      row("kind", g.kind); row("region", g.region);
      if (g.ops) row("ops", String(g.ops));
      if (g.owner && ix.nodes.has(g.owner)) row("owner", link(ix.nodes.get(g.owner).label + " (" + g.owner + ")", g.owner));
      P.hidden = false; return;
    }
    var n = ix.nodes.get(id);
    h("div", "pdv-ptitle", n.kind === "data" ? n.label : n.type, P);
    row("id", n.id);
    if (n.kind === "data") {
      row("variable", n.var); row("shape", shapeText(vars[n.var]));
      P.hidden = false; return;
    }
    row("name", n.label); row("region", n.region);
    var path = [];
    for (var p = n._parent; p; p = ix.groups.get(p)._parent) path.unshift(ix.groups.get(p).label);
    row("group", path.join(" / "));
    if (n.forward) {
      var fwd = ix.nodes.get(n.forward);
      row("gradient of", fwd ? link(fwd.type + " (" + n.forward + ")", n.forward, "pdv-link pdv-grad-link") : n.forward);
    }
    var shard = [];
    ["inputs", "outputs"].forEach(function (side) {
      var slots = n[side] || [];
      h("div", "pdv-section", side, P);
      var t = h("div", "pdv-vars pdv-" + side, null, P);
      slots.forEach(function (s) {
        s[1].forEach(function (name) {
          var v = vars[name], io = h("div", "pdv-io" + (name === variable ? " pdv-hit" : ""), null, t);
          var head = h("div", "pdv-iohead", null, io);
          h("span", "pdv-slot", s[0], head);
          var nm = h("span", "pdv-var", null, head);
          var src = side === "inputs" ? ix.producer.get(name) : null;
          if (src && src !== id && !(v && v.persistable)) nm.appendChild(link(name, src)); else nm.textContent = name;
          if (v && (v.kind === "parameter" || v.persistable)) nm.classList.add("pdv-param");
          var meta = h("div", "pdv-meta", null, io);
          h("span", "pdv-shape", dims(v && v.shape), meta);
          h("span", "pdv-dtype", v ? v.dtype : "", meta);
          if (v && v.kind) h("span", "pdv-vkind", v.kind, meta);
          if (v && v.sharding != null) shard.push(name + ": " + (typeof v.sharding === "string" ? v.sharding : JSON.stringify(v.sharding)));
        });
      });
      if (!slots.length) h("div", "pdv-none", "none", P);
    });
    if (n.attrs && n.attrs.length) {
      h("div", "pdv-section", "attributes", P);
      var at = h("table", "pdv-attrs", null, P);
      n.attrs.forEach(function (a) {
        var tr = h("tr", null, null, at); h("td", "pdv-slot", a[0], tr); h("td", null, a[1], tr);
      });
    }
    row("sharding", shard.length ? shard.join("; ") : "none");
    if (n.callsite) row("callsite", n.callsite).classList.add("pdv-callsite");
    (n.blocks || []).forEach(function (b) {
      if (ix.groups.has(b)) row("sub-block", link(ix.groups.get(b).label, b));
    });
    P.hidden = false;
  };

  /* ---- search ---- */
  Viewer.prototype.showResults = function (q) {
    var self = this, ix = this.ix, R = this.results;
    R.textContent = "";
    q = q.trim().toLowerCase();
    if (!q) { R.hidden = true; return; }
    // exact names first, then names that start with the text, then the rest, 40 at most
    var out = [], LIMIT = 40;
    var add = function (name, text, target, kind, hit) {
      var at = name.toLowerCase().indexOf(q);
      if (at < 0) return;
      out.push([text, target, kind, name.length === q.length ? 0 : at === 0 ? 1 : 2, out.length, hit]);
    };
    Object.keys(ix.model.vars || {}).forEach(function (v) {
      var info = ix.model.vars[v] || {}, t = info.persistable ?   // a parameter: where it is used
        ix.consumer.get(v) || ix.producer.get(v) : ix.producer.get(v) || ix.consumer.get(v);
      if (t) add(v, v, t, "variable", v);
    });
    ix.model.nodes.forEach(function (n) {
      if (n.kind !== "op") return;
      if (n.id.toLowerCase() === q) add(n.id, n.type + "  " + n.id, n.id, "op");
      else if (n.type.toLowerCase().indexOf(q) >= 0) add(n.type, n.type + "  " + n.id, n.id, "op");
      else add(n.label, n.label + "  " + n.id, n.id, "op");
    });
    ix.groups.forEach(function (g, id) {
      var path = id.replace(/^[a-z]:/, "");
      if (g.label.toLowerCase().indexOf(q) >= 0) add(g.label, path, id, g.kind); else add(path, path, id, g.kind);
    });
    out.sort(function (a, b) { return a[3] - b[3] || a[4] - b[4]; });
    out = out.slice(0, LIMIT);
    if (!out.length) h("li", "pdv-noresult", "no match", R);
    out.forEach(function (r) {
      var li = h("li", "pdv-result", null, R);
      h("span", "pdv-rtext", r[0], li); h("span", "pdv-rkind", r[2], li);
      li.setAttribute("data-id", r[1]);
      li.addEventListener("click", function () { R.hidden = true; self.select(r[1], true, r[5]); });
    });
    R.hidden = false;
  };

  function init(root) {
    var data = root.querySelector("script.pdv-data");
    var model = JSON.parse(data.textContent);
    var v = new Viewer(root, model);
    window.progdescViewers = window.progdescViewers || {};
    window.progdescViewers[root.id] = v;
    return v;
  }
  window.progdescViewer = { init: init, Viewer: Viewer, version: VERSION };
})();
