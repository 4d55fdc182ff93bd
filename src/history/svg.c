/* SPDX-License-Identifier: MIT */
/*
 * The pictures of ckfs diff --svg (include/ckfs/history.h): per role, a
 * heat map of the relative change ||B - A|| / ||A|| of each layer (rows)
 * for each pair of steps (columns), on a log scale, and the same figure
 * per tensor kind as lines. Plain SVG 1.1 written into a strbuf: rects,
 * text, polylines; every cell carries a <title> with its figures, which
 * browsers show on hover. Names come from checkpoints: they are written
 * as XML text with markup and control characters escaped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/history.h"
#include "ckfs/strbuf.h"
#include "ckfs/text.h"

#define CELL_W 30
#define CELL_H 14
#define LABEL_W 220   /* room for the row names */
#define LINES_H 180   /* the lines chart's plot height */
#define MARGIN 16
#define FONT "font-family=\"monospace\" font-size=\"11\""
#define FONT_TITLE "font-family=\"monospace\" font-size=\"13\" font-weight=\"bold\""

/* Text from a checkpoint as XML character data. */
static void xml_text(struct ckfs_strbuf *b, const char *s)
{
	while (*s) {
		size_t n = ckfs_utf8_seq((const unsigned char *)s);
		unsigned char c = (unsigned char)*s;
		if (n == 0 || c < 0x20 || c == 0x7F) {
			ckfs_strbuf_str(b, "?");
			s += n ? n : 1;
			continue;
		}
		switch (c) {
		case '&': ckfs_strbuf_str(b, "&amp;"); break;
		case '<': ckfs_strbuf_str(b, "&lt;"); break;
		case '>': ckfs_strbuf_str(b, "&gt;"); break;
		case '"': ckfs_strbuf_str(b, "&quot;"); break;
		default: ckfs_strbuf_put(b, s, n); break;
		}
		s += n;
	}
}

/* A colour ramp (dark blue, teal, green, yellow) at t in [0, 1]. */
static void ramp(double t, char *out, size_t size)
{
	static const double stops[][3] = {
		{ 0x26, 0x1f, 0x6b }, { 0x21, 0x91, 0x8c }, { 0x5e, 0xc9, 0x62 }, { 0xfd, 0xe7, 0x25 },
	};
	const int last = (int)(sizeof(stops) / sizeof(stops[0])) - 1;
	double x = (t < 0 ? 0 : t > 1 ? 1 : t) * last;
	int i = x >= last ? last - 1 : (int)x;
	double f = x - i;
	int rgb[3];

	for (int k = 0; k < 3; k++)
		rgb[k] = (int)lround(stops[i][k] + f * (stops[i + 1][k] - stops[i][k]));
	snprintf(out, size, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

/* The union of the diffs' layer rows, in order of first appearance. */
struct rows {
	const char **name;
	size_t n;
};

static enum ckfs_code collect_rows(const struct ckfs_diff_history *h, struct ckfs_arena *ar,
				   struct rows *r, struct ckfs_error *err)
{
	size_t cap = 0;

	for (size_t c = 0; c < h->n; c++)
		cap += h->diffs[c] ? h->diffs[c]->n_layers : 0;
	r->name = ckfs_arena_calloc(ar, cap + 1, sizeof(*r->name));
	if (!r->name)
		return ckfs_nomem(err);
	for (size_t c = 0; c < h->n; c++)
		for (size_t l = 0; h->diffs[c] && l < h->diffs[c]->n_layers; l++) {
			const char *name = h->diffs[c]->layers[l].name;
			size_t k = 0;
			while (k < r->n && strcmp(r->name[k], name) != 0)
				k++;
			if (k == r->n)
				r->name[r->n++] = name;
		}
	return CKFS_OK;
}

static const struct ckfs_diff_group *find_layer(const struct ckfs_diff *d, const char *name)
{
	for (size_t l = 0; d && l < d->n_layers; l++)
		if (strcmp(d->layers[l].name, name) == 0)
			return &d->layers[l];
	return NULL;
}

/* A group's relative change when it has one worth a colour: something
 * compared changed (identical groups and absent ones have none). */
static bool group_value(const struct ckfs_diff_group *g, double *v)
{
	if (!g || g->changed == 0)
		return false;
	*v = ckfs_diff_rel_l2(&g->sums);
	return isfinite(*v) && *v > 0;
}

/* The decades the colours and the lines span: [lo, hi], at least one. */
static void value_range(const struct ckfs_diff_history *h, const struct rows *r, double *lo,
			double *hi)
{
	bool any = false;
	double v;

	*lo = -8;
	*hi = 0;
	for (size_t c = 0; c < h->n; c++) {
		for (size_t k = 0; k < r->n; k++)
			if (group_value(find_layer(h->diffs[c], r->name[k]), &v)) {
				double e = log10(v);
				*lo = any && *lo < e ? *lo : e;
				*hi = any && *hi > e ? *hi : e;
				any = true;
			}
		for (int k = 0; h->diffs[c] && k < CKFS_KIND_COUNT; k++)
			if (group_value(&h->diffs[c]->kinds[k], &v)) {
				double e = log10(v);
				*lo = any && *lo < e ? *lo : e;
				*hi = any && *hi > e ? *hi : e;
				any = true;
			}
	}
	*lo = floor(*lo);
	*hi = ceil(*hi);
	if (*hi - *lo < 1)
		*hi = *lo + 1;
}

static void cell_title(struct ckfs_strbuf *b, const char *row, const char *col,
		       const struct ckfs_diff_group *g)
{
	ckfs_strbuf_str(b, "<title>");
	xml_text(b, row);
	ckfs_strbuf_str(b, " ");
	xml_text(b, col);
	if (!g)
		ckfs_strbuf_str(b, ": absent");
	else if (g->changed == 0 && g->other == 0)
		ckfs_strbuf_fmt(b, ": identical (%zu tensors)", g->tensors);
	else
		ckfs_strbuf_fmt(b, ": %zu of %zu tensors changed, ||B-A||/||A|| %.3g, max|B-A| %.3g",
				g->changed, g->tensors, ckfs_diff_rel_l2(&g->sums), g->sums.max_abs);
	ckfs_strbuf_str(b, "</title>");
}

/* One role's heat map and lines at vertical offset y; returns its height
 * and sets *width to the width it needs. */
static int draw_history(struct ckfs_strbuf *b, const struct ckfs_diff_history *h,
			const struct rows *r, int y, int *width)
{
	static const char *const kind_colour[CKFS_KIND_COUNT] = {
		"#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c", "#d62728", "#7f7f7f",
	};
	double lo, hi, v;
	char colour[16];
	int x0 = MARGIN + LABEL_W, top = y;

	value_range(h, r, &lo, &hi);
	ckfs_strbuf_fmt(b, "<text x=\"%d\" y=\"%d\" " FONT_TITLE ">",
			MARGIN, y + 14);
	xml_text(b, h->title);
	ckfs_strbuf_str(b, ": relative change ||B-A||/||A|| per layer (log scale)</text>\n");
	y += 26;
	for (size_t k = 0; k < r->n; k++) {
		int cy = y + (int)k * CELL_H;
		ckfs_strbuf_fmt(b, "<text x=\"%d\" y=\"%d\" " FONT " text-anchor=\"end\">",
				x0 - 6, cy + CELL_H - 3);
		xml_text(b, r->name[k]);
		ckfs_strbuf_str(b, "</text>\n");
		for (size_t c = 0; c < h->n; c++) {
			const struct ckfs_diff_group *g = find_layer(h->diffs[c], r->name[k]);
			const char *fill = "#ffffff";
			if (group_value(g, &v)) {
				ramp((log10(v) - lo) / (hi - lo), colour, sizeof(colour));
				fill = colour;
			} else if (g && g->changed == 0) {
				fill = "#d9d9d9"; /* identical */
			}
			ckfs_strbuf_fmt(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
					"fill=\"%s\" stroke=\"#ffffff\">", x0 + (int)c * CELL_W, cy,
					CELL_W, CELL_H, fill);
			cell_title(b, r->name[k], h->labels[c], g);
			ckfs_strbuf_str(b, "</rect>\n");
		}
	}
	y += (int)r->n * CELL_H + 4;
	for (size_t c = 0; c < h->n; c++) {
		ckfs_strbuf_fmt(b, "<text " FONT " transform=\"translate(%d,%d) rotate(45)\">",
				x0 + (int)c * CELL_W + CELL_W / 2 - 3, y + 6);
		xml_text(b, h->labels[c]);
		ckfs_strbuf_str(b, "</text>\n");
	}
	y += 70;
	/* the colour scale: one swatch per decade, and grey for identical */
	for (int e = (int)lo; e <= (int)hi; e++) {
		int sx = x0 + (e - (int)lo) * 48;
		ramp(((double)e - lo) / (hi - lo), colour, sizeof(colour));
		ckfs_strbuf_fmt(b, "<rect x=\"%d\" y=\"%d\" width=\"46\" height=\"10\" fill=\"%s\"/>"
				"<text x=\"%d\" y=\"%d\" " FONT ">1e%d</text>\n",
				sx, y, colour, sx, y + 22, e);
	}
	ckfs_strbuf_fmt(b, "<rect x=\"%d\" y=\"%d\" width=\"46\" height=\"10\" fill=\"#d9d9d9\"/>"
			"<text x=\"%d\" y=\"%d\" " FONT ">identical</text>\n",
			x0 + ((int)(hi - lo) + 2) * 48, y, x0 + ((int)(hi - lo) + 2) * 48, y + 22);
	y += 40;

	/* lines: one per kind with something compared, x the pairs */
	int plot_w = (int)(h->n > 1 ? h->n - 1 : 1) * CELL_W * 2, py = y + 20;
	ckfs_strbuf_fmt(b, "<text x=\"%d\" y=\"%d\" " FONT ">relative change per tensor kind</text>\n",
			MARGIN, y + 10);
	ckfs_strbuf_fmt(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
			"stroke=\"#999999\"/>\n", x0, py, plot_w, LINES_H);
	for (int e = (int)lo; e <= (int)hi; e++) {
		int gy = py + LINES_H - (int)lround((e - lo) / (hi - lo) * LINES_H);
		ckfs_strbuf_fmt(b, "<text x=\"%d\" y=\"%d\" " FONT " text-anchor=\"end\">1e%d</text>\n",
				x0 - 6, gy + 4, e);
	}
	int legend = 0;
	for (int k = 0; k < CKFS_KIND_COUNT; k++) {
		bool any = false;
		for (size_t c = 0; c < h->n; c++)
			any |= h->diffs[c] && h->diffs[c]->kinds[k].tensors > 0;
		if (!any)
			continue;
		ckfs_strbuf_fmt(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
				kind_colour[k]);
		for (size_t c = 0; c < h->n; c++) {
			const struct ckfs_diff_group *g = h->diffs[c] ? &h->diffs[c]->kinds[k] : NULL;
			double e = group_value(g, &v) ? log10(v) : lo; /* identical: the floor */
			ckfs_strbuf_fmt(b, "%s%d,%d", c ? " " : "",
					x0 + (h->n > 1 ? (int)c * plot_w / (int)(h->n - 1) : plot_w / 2),
					py + LINES_H - (int)lround((e - lo) / (hi - lo) * LINES_H));
		}
		ckfs_strbuf_str(b, "\"/>\n");
		ckfs_strbuf_fmt(b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"3\" fill=\"%s\"/>"
				"<text x=\"%d\" y=\"%d\" " FONT ">%s</text>\n",
				x0 + plot_w + 14, py + 8 + legend * 16, kind_colour[k],
				x0 + plot_w + 30, py + 12 + legend * 16,
				ckfs_diff_kind_name((enum ckfs_diff_kind)k));
		legend++;
	}
	y = py + LINES_H + 30;
	/* the widest of: the title (7 px a character), the cells, the scale,
	 * the lines with their legend */
	int w = MARGIN + (int)(strlen(h->title) + 56) * 7;
	int parts[] = { (int)h->n * CELL_W, ((int)(hi - lo) + 3) * 48, plot_w + 130 };
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		w = x0 + parts[i] > w ? x0 + parts[i] : w;
	*width = w + MARGIN;
	return y - top;
}

enum ckfs_code ckfs_diff_svg(const struct ckfs_diff_history *h, size_t n_histories,
			     char **out, size_t *len, struct ckfs_error *err)
{
	struct ckfs_strbuf body = { 0 }, b = { 0 };
	struct ckfs_arena ar;
	enum ckfs_code rc = CKFS_OK;
	int y = MARGIN, width = 0;

	*out = NULL;
	ckfs_arena_init(&ar);
	for (size_t i = 0; i < n_histories && rc == CKFS_OK; i++) {
		struct rows r = { 0 };
		rc = collect_rows(&h[i], &ar, &r, err);
		int w = 0;
		if (rc == CKFS_OK)
			y += draw_history(&body, &h[i], &r, y, &w);
		width = w > width ? w : width;
	}
	ckfs_strbuf_fmt(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
			"<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
			"height=\"%d\" viewBox=\"0 0 %d %d\">\n"
			"<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
			width, y + MARGIN, width, y + MARGIN);
	if (body.p)
		ckfs_strbuf_put(&b, body.p, body.len);
	ckfs_strbuf_str(&b, "</svg>\n");
	ckfs_arena_release(&ar);
	free(body.p);
	if (rc == CKFS_OK && (b.failed || body.failed))
		rc = ckfs_nomem(err);
	if (rc != CKFS_OK) {
		free(b.p);
		return rc;
	}
	*out = b.p;
	*len = b.len;
	return CKFS_OK;
}
