/* quantbench report: sortable and filterable tables, on-demand histograms, copy button.
   Plain ES2017, no libraries, no network. Everything degrades to a static page without it. */
(function () {
  "use strict";
  var collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
  var MISSING = "\u2014";

  function esc(text) {
    return String(text).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  /* ---- sorting: numbers by their exact data-v value, text by natural order; missing last ---- */
  function cellKey(cell, type) {
    if (!cell) return null;
    if (type === "num") {
      var raw = cell.getAttribute("data-v");
      if (raw === null || raw === "") return null;
      var value = Number(raw);
      return isNaN(value) ? null : value;
    }
    var text = cell.textContent.trim();
    return text === "" || text === MISSING ? null : text;
  }

  function sortTable(table, th) {
    var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var column = headers.indexOf(th);
    var type = th.getAttribute("data-type") || "str";
    var descending = th.getAttribute("aria-sort") === "ascending";
    headers.forEach(function (h) { h.setAttribute("aria-sort", "none"); });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows).map(function (row, i) {
      return { row: row, key: cellKey(row.cells[column], type), i: i };
    });
    rows.sort(function (a, b) {
      if (a.key === null || b.key === null) {
        return a.key === b.key ? a.i - b.i : a.key === null ? 1 : -1;
      }
      var order = type === "num" ? (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)
                                 : collator.compare(a.key, b.key);
      return (descending ? -order : order) || a.i - b.i;
    });
    var fragment = document.createDocumentFragment();
    rows.forEach(function (item) { fragment.appendChild(item.row); });
    body.appendChild(fragment);
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      th.addEventListener("click", function () { sortTable(table, th); });
      th.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sortTable(table, th); }
      });
    });
  });

  /* ---- filtering: a text box matches the text columns, a select matches a row's view ---- */
  function searchText(table) {
    var textColumns = [];
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      if (th.getAttribute("data-type") === "str") textColumns.push(i);
    });
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      row._search = textColumns.map(function (i) {
        return row.cells[i] ? row.cells[i].textContent : "";
      }).join("\u0001").toLowerCase();
    });
  }

  function applyFilters(tableId) {
    var table = document.getElementById(tableId);
    if (!table) return;
    var box = document.querySelector('[data-filter="' + tableId + '"]');
    var select = document.querySelector('[data-view-filter="' + tableId + '"]');
    var needle = box ? box.value.trim().toLowerCase() : "";
    var view = select ? select.value : "";
    var rows = table.tBodies[0].rows, shown = 0;
    for (var i = 0; i < rows.length; i++) {
      var row = rows[i];
      var visible = (!needle || row._search.indexOf(needle) !== -1) &&
                    (!view || row.getAttribute("data-view") === view);
      row.hidden = !visible;
      if (visible) shown++;
    }
    var count = document.querySelector('[data-count-for="' + tableId + '"]');
    if (count) count.textContent = shown === rows.length ? rows.length + " rows" : shown + " of " + rows.length + " rows";
  }

  document.querySelectorAll("[data-filter], [data-view-filter]").forEach(function (control) {
    var tableId = control.getAttribute("data-filter") || control.getAttribute("data-view-filter");
    var table = document.getElementById(tableId);
    if (!table) return;
    if (!table._indexed) { searchText(table); table._indexed = true; }
    control.addEventListener("input", function () { applyFilters(tableId); });
    control.addEventListener("change", function () { applyFilters(tableId); });
  });

  /* ---- on-demand histogram: the same drawing as the Python charts.histogram_chart ---- */
  function num(v) { var t = v.toFixed(1); return t.slice(-2) === ".0" ? t.slice(0, -2) : t; }
  function fmt(v) {
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e9 || a < 1e-3) return v.toExponential(3).replace("-", "\u2212");
    if (a >= 1e4) return Math.round(v).toLocaleString("en-US");
    return String(Number(v.toPrecision(4))).replace("-", "\u2212");
  }
  function niceStep(span, maxTicks) {
    if (!(span > 0)) return 1;
    var raw = span / Math.max(maxTicks, 1), power = Math.pow(10, Math.floor(Math.log10(raw)));
    var factors = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < factors.length; i++) if (factors[i] * power >= raw) return factors[i] * power;
    return 10 * power;
  }
  function countLabel(power) {
    var suffix = { 0: "", 3: "k", 6: "M", 9: "G", 12: "T" }[power - power % 3];
    return Math.pow(10, power % 3) + (suffix === undefined ? "e" + (power - power % 3) : suffix);
  }
  function tag(name, attrs, body) {
    var out = "<" + name;
    for (var key in attrs) out += " " + key + '="' + (typeof attrs[key] === "number" ? num(attrs[key]) : esc(attrs[key])) + '"';
    return body === undefined ? out + "/>" : out + ">" + body + "</" + name + ">";
  }

  function histogramSvg(data, entry) {
    var lay = data.layout, name = entry[0], upper = entry[1];
    var counts = entry[2].map(function (level) { return Math.pow(10, level / data.log_levels) - 1; });
    var amax = entry[3], used = entry[4];
    var plotW = lay.width - lay.left - lay.right, plotH = lay.height - lay.top - lay.bottom;
    var left = lay.left, top = lay.top, base = top + plotH;
    var peak = Math.log10(1 + Math.max.apply(null, counts.concat([0]))) || 1;
    var binW = plotW / Math.max(counts.length, 1);
    var toY = function (c) { return base - Math.log10(1 + c) / peak * plotH; };
    var toX = function (v) { return left + Math.min(Math.max(v / upper, 0), 1) * plotW; };
    var parts = [], p, i;
    for (p = 0; p <= Math.floor(peak); p += peak <= 6 ? 1 : 2) {
      var y = toY(Math.pow(10, p) - 1);
      parts.push(tag("line", { x1: left, x2: left + plotW, y1: y, y2: y, "class": "grid" }));
      parts.push(tag("text", { x: left - 6, y: y + 3.5, "class": "tick end" }, countLabel(p)));
    }
    var step = niceStep(upper, 5);
    for (var t = 0; t <= upper * (1 + 1e-9); t = Math.round((t + step) * 1e10) / 1e10) {
      parts.push(tag("text", { x: toX(t), y: base + 14, "class": "tick mid" }, String(Number(t.toPrecision(10))).replace("-", "\u2212")));
    }
    parts.push(tag("text", { x: left + plotW / 2, y: lay.height - 4, "class": "axis-title" }, "|x|"));
    var d = "M" + num(left) + " " + num(base);
    for (i = 0; i < counts.length; i++) d += "V" + num(toY(Math.max(counts[i], 0))) + "H" + num(left + (i + 1) * binW);
    parts.push(tag("path", { d: d + "V" + num(base) + "Z", "class": "bars" }));
    parts.push(tag("line", { x1: left, x2: left + plotW, y1: base, y2: base, "class": "axis" }));
    var row = 0, legendX = left + plotW + 14;
    data.methods.forEach(function (method) {
      if (typeof amax[method] !== "number") return;
      var isUsed = method === used, cls = isUsed ? "thr used" : "thr", colour = data.colours[method];
      var x = toX(amax[method]), ly = top + 10 + row * 15;
      parts.push(tag("line", { x1: x, x2: x, y1: top, y2: base, stroke: colour, "class": cls },
        "<title>" + esc(method + ": amax " + fmt(amax[method])) + "</title>"));
      parts.push(tag("line", { x1: legendX, x2: legendX + 16, y1: ly - 4, y2: ly - 4, stroke: colour, "class": cls }));
      var label = (method.length > 16 ? method.slice(0, 8) + "\u2026" + method.slice(-7) : method) + " " + fmt(amax[method]);
      parts.push(tag("text", { x: legendX + 21, y: ly, "class": isUsed ? "legend used" : "legend" }, esc(label + (isUsed ? " \u2713" : ""))));
      row++;
    });
    var label = "|x| histogram of " + name;
    return tag("svg", { "class": "chart hist", width: lay.width, height: lay.height,
      viewBox: "0 0 " + lay.width + " " + lay.height, role: "img", "aria-label": label },
      "<title>" + esc(label) + "</title>" + parts.join(""));
  }

  var dataNode = document.getElementById("qb-histograms");
  var select = document.getElementById("hist-select");
  if (dataNode && select) {
    var data = JSON.parse(dataNode.textContent);
    var byName = {};
    data.tensors.forEach(function (entry) { byName[entry[0]] = entry; });
    var draw = function () {
      var entry = byName[select.value];
      if (!entry) return;
      document.getElementById("hist-demand-name").textContent = entry[0];
      document.getElementById("hist-demand-chart").innerHTML = histogramSvg(data, entry);
    };
    select.addEventListener("change", draw);
    draw();
  }

  /* ---- copy the reproducing command ---- */
  var copy = document.getElementById("copy-command");
  var command = document.getElementById("command");
  if (copy && command) {
    copy.addEventListener("click", function () {
      var done = function () { copy.textContent = "Copied"; setTimeout(function () { copy.textContent = "Copy"; }, 1500); };
      var fallback = function () {
        var range = document.createRange();
        range.selectNodeContents(command);
        var selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        copy.textContent = "Selected: press Ctrl+C";
      };
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(command.textContent).then(done, fallback);
      } else {
        fallback();
      }
    });
  }
})();
