/* SPDX-License-Identifier: MIT */
/*
 * ckfs help: a command's --help by name, and, hidden, the manual page
 * ckfs(1) (`ckfs help --man`), the bash completion script (`ckfs help
 * --bash-completion`) and the option names as JSON for programs that
 * pass options (`ckfs help --options-json`: python/ckfs checks keyword
 * names against it). The build runs the binary to make the first two, so
 * they come from the same option tables as --help and cannot disagree
 * with it: every command of ckfs_commands, every option of its table,
 * every -o key of the mount's.
 */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/options.h"

/* The options of cmd's --help, in its order: the table, then --help. */
static const struct cli_opt *nth_opt(const struct cli_command *cmd, size_t i)
{
	size_t n = 0;

	while (cmd->opts[n])
		n++;
	return i < n ? cmd->opts[i] : i == n ? &cli_opt_help : NULL;
}

static bool takes_o(const struct cli_command *cmd)
{
	for (const struct cli_opt *const *o = cmd->opts; *o; o++)
		if ((*o)->id == OPT_MOUNT_OPTIONS)
			return true;
	return false;
}

/* ---- the manual page (man(7) macros) ---- */

/* Text as roff: backslashes and hyphens escaped, the help texts' line
 * breaks joined, a leading dot or quote made literal. */
static void roff(FILE *to, const char *s)
{
	bool line_start = true;

	for (; *s; s++) {
		if (line_start && (*s == '.' || *s == '\''))
			fputs("\\&", to);
		line_start = false;
		if (*s == '\\')
			fputs("\\e", to);
		else if (*s == '-')
			fputs("\\-", to);
		else if (*s == '\n')
			fputc(' ', to);
		else
			fputc(*s, to);
	}
}

static void roff_bold(FILE *to, const char *s)
{
	fputs("\\fB", to);
	roff(to, s);
	fputs("\\fR", to);
}

static void roff_italic(FILE *to, const char *s)
{
	fputs("\\fI", to);
	roff(to, s);
	fputs("\\fR", to);
}

/* "\fB-o key=\fR\fIARG\fR" (or a flag's bare key). */
static void man_key(FILE *to, const struct cli_opt *o, bool with_o)
{
	fputs("\\fB", to);
	if (with_o)
		fputs("\\-o ", to);
	roff(to, o->key);
	fputs(o->arg ? "=\\fR" : "\\fR", to);
	if (o->arg)
		roff_italic(to, o->arg);
}

/* o's help, its default appended, as a line of its own. */
static void man_help(FILE *to, const struct cli_opt *o)
{
	char help[512];

	cli_opt_help_text(o, help, sizeof(help));
	roff(to, help);
	fputc('\n', to);
}

/* One option as a tagged paragraph: its spellings, then its help. */
static void man_option(FILE *to, const struct cli_opt *o, bool show_key)
{
	fputs(".TP\n", to);
	if (o->letter)
		fprintf(to, "\\fB\\-%c\\fR, ", o->letter);
	fputs("\\fB\\-\\-", to);
	roff(to, o->name);
	fputs("\\fR", to);
	if (o->arg) {
		fputc(' ', to);
		roff_italic(to, o->arg);
	}
	if (show_key && o->key) {
		fputs(", ", to);
		man_key(to, o, true);
	}
	fputc('\n', to);
	man_help(to, o);
}

static void man_synopsis(FILE *to)
{
	fputs(".SH SYNOPSIS\n", to);
	for (const struct cli_command *const *c = ckfs_commands; *c; c++) {
		fputs(".B ckfs ", to);
		roff(to, (*c)->name);
		fputs("\n[\\fIoptions\\fR]", to);
		for (const char *p = (*c)->args; *p;) {
			size_t len = strcspn(p, " ");
			fprintf(to, " \\fI%.*s\\fR", (int)len, p);
			p += len + (p[len] == ' ');
		}
		fputs("\n.br\n", to);
	}
	fputs(".B ckfs\n\\fISRC\\fR \\fIMNT\\fR \\fB\\-o\\fR \\fIOPTS\\fR"
	      " (as run by \\fBmount.fuse3\\fR(8))\n.br\n"
	      ".B ckfs \\-\\-version\n.br\n"
	      ".B ckfs help\n[\\fICOMMAND\\fR]\n", to);
}

static void man_commands(FILE *to)
{
	fputs(".SH COMMANDS\n"
	      "Every command takes its options before, between or after its "
	      "arguments, and \\fB\\-h\\fR, \\fB\\-\\-help\\fR prints them.\n", to);
	for (const struct cli_command *const *c = ckfs_commands; *c; c++) {
		const struct cli_command *cmd = *c;
		bool show_key = takes_o(cmd);

		fputs(".SS \"ckfs ", to);
		roff(to, cmd->name);
		fputc(' ', to);
		roff(to, cmd->args);
		fputs("\"\n", to);
		roff(to, cmd->about);
		fputc('\n', to);
		for (size_t i = 0; nth_opt(cmd, i); i++)
			if (nth_opt(cmd, i)->name)
				man_option(to, nth_opt(cmd, i), show_key);
	}
}

static void man_word_list(FILE *to, const char *const *words)
{
	for (const char *const *w = words; *w; w++) {
		fputs(w == words ? "" : ", ", to);
		roff_bold(to, *w);
	}
}

/* Every -o key of the mount's table, and the keys passed to libfuse. */
static void man_mount_options(FILE *to)
{
	fputs(".SH MOUNT OPTIONS\n"
	      "The keys \\fBckfs mount \\-o\\fR takes, as a comma list, on the command "
	      "line, in \\fB/etc/fstab\\fR and in systemd units. Keys with a long "
	      "option set the same thing.\n", to);
	for (const struct cli_command *const *c = ckfs_commands; *c; c++) {
		if (!takes_o(*c))
			continue;
		for (const struct cli_opt *const *p = (*c)->opts; *p; p++) {
			const struct cli_opt *o = *p;
			if (!o->key)
				continue;
			fputs(".TP\n", to);
			man_key(to, o, false);
			if (o->name) {
				fputs(" (\\fB\\-\\-", to);
				roff(to, o->name);
				fputs("\\fR)", to);
			}
			fputc('\n', to);
			man_help(to, o);
		}
	}
	fputs(".PP\nlibfuse's options are passed on: ", to);
	man_word_list(to, ckfs_mount_fuse_flags);
	fputs(", and ", to);
	for (const char *const *w = ckfs_mount_fuse_keys; *w; w++) {
		fputs(w == ckfs_mount_fuse_keys ? "" : ", ", to);
		roff_bold(to, *w);
		fputs("\\fB=\\fR\\fIVALUE\\fR", to);
	}
	fputs(". The mount is always read\\-only, with \\fBdefault_permissions\\fR; "
	      "\\fBfsname\\fR defaults to the checkpoint path and \\fBsubtype\\fR to "
	      "\\fBckfs\\fR (type \\fBfuse.ckfs\\fR).\n"
	      ".PP\nOptions meant for \\fBmount\\fR(8) and systemd are ignored: ", to);
	man_word_list(to, ckfs_mount_ignored_keys);
	fputs(", \\fBcomment=\\fR and every \\fBx\\-\\fR key. Any other key is a "
	      "usage error.\n", to);
}

static const char man_head[] =
	".TH CKFS 1 \"\" \"ckfs " CKFS_VERSION "\" \"User Commands\"\n"
	".SH NAME\n"
	"ckfs \\- serve a distributed training checkpoint as a Hugging Face model folder\n";

static const char man_description[] =
	".SH DESCRIPTION\n"
	"\\fBckfs\\fR reads a training checkpoint saved in shards (verl FSDP rank files, "
	"Megatron per\\-rank and dist_checkpointing folders, torch.distributed.checkpoint "
	"folders, Hugging Face safetensors folders) from its metadata only, and serves "
	"the Hugging Face folder it stands for: \\fBmodel.safetensors\\fR (or shards with "
	"\\fBmodel.safetensors.index.json\\fR), \\fBconfig.json\\fR with the served dtype, "
	"and the tokenizer and other side files. \\fBckfs mount\\fR serves it read\\-only "
	"through FUSE, assembling tensor bytes when they are read; \\fBckfs export\\fR "
	"writes the same folder once.\n"
	".PP\n"
	"Nothing is ever guessed: anything \\fBckfs\\fR does not fully understand is "
	"refused with one line naming the file and the cause, and nothing "
	"half\\-written is left behind.\n"
	".PP\n"
	"\\fBckfs \\-\\-version\\fR prints the version and the versions of the libraries "
	"it was built with. \\fBckfs help\\fR \\fICOMMAND\\fR prints a command's options, "
	"as \\fBckfs\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR does.\n";

static const char man_tail[] =
	".SH EXIT STATUS\n"
	".TP\n\\fB0\\fR\nsuccess; for \\fBmount\\fR, the folder is mounted and ready to read\n"
	".TP\n\\fB1\\fR\nfailure, reported by one line on standard error, "
	"\\fBckfs: '\\fR\\fIfile\\fR\\fB': \\fR\\fIcause\\fR; nothing is left mounted "
	"or half\\-written\n"
	".TP\n\\fB2\\fR\nusage error: an unknown command, option or mount option, a bad "
	"value, missing or extra arguments\n"
	".SH FILES\n"
	".TP\n\\fB/dev/fuse\\fR\nthe FUSE device; \\fBfusermount3\\fR(1) (package fuse3) "
	"mounts for users other than root\n"
	".TP\n\\fB/etc/fstab\\fR\nmounts of type \\fBfuse.ckfs\\fR, run through "
	"\\fBmount.fuse3\\fR(8)\n"
	".TP\n\\fB/etc/fuse.conf\\fR\n\\fBuser_allow_other\\fR lets users other than "
	"root mount with \\fB\\-o allow_other\\fR\n"
	".TP\n\\fB/etc/ckfs/\\fR\\fIINSTANCE\\fR\\fB.conf\\fR\n\\fBCKFS_SOURCE\\fR and "
	"\\fBCKFS_OPTIONS\\fR of the \\fBckfs@\\fR\\fIINSTANCE\\fR\\fB.service\\fR "
	"systemd unit, whose instance is the escaped mount point\n"
	".TP\n\\fBckfs@.service\\fR, \\fBmnt\\-merged.mount\\fR\nsystemd units "
	"(a template service, an example mount unit) in systemd's unit folder\n"
	".TP\n\\fIMNT\\fR (extended attributes \\fBuser.ckfs.stats\\fR, "
	"\\fBuser.ckfs.source\\fR)\na mount's counters as JSON and its checkpoint "
	"path, read by \\fBckfs stats\\fR\n"
	".SH EXAMPLES\n"
	"Serve a verl actor checkpoint to vLLM, then unmount:\n"
	".PP\n.nf\n.RS\n"
	"ckfs mount ./checkpoints/global_step_100/actor /mnt/merged\n"
	"vllm serve /mnt/merged\n"
	"ckfs umount /mnt/merged\n"
	".RE\n.fi\n.PP\n"
	"Write the merged folder once, in shards of at most 5 GB, and check it:\n"
	".PP\n.nf\n.RS\n"
	"ckfs export \\-\\-max\\-shard\\-size 5GB ./global_step_100/actor ./merged\n"
	"ckfs verify ./global_step_100/actor \\-\\-against ./merged\n"
	".RE\n.fi\n.PP\n"
	"Mount from /etc/fstab, readable by a service user, with a 2 GiB cache:\n"
	".PP\n.nf\n.RS\n"
	"/data/run1/actor /mnt/merged fuse.ckfs "
	"ro,dtype=bf16,cache_size=2GiB,allow_other,nofail 0 0\n"
	".RE\n.fi\n.PP\n"
	"Export a mount's counters for the node_exporter textfile collector:\n"
	".PP\n.nf\n.RS\n"
	"d=/var/lib/prometheus/node\\-exporter\n"
	"ckfs stats \\-\\-prometheus /mnt/merged > $d/ckfs.prom.tmp\n"
	"mv $d/ckfs.prom.tmp $d/ckfs.prom\n"
	".RE\n.fi\n"
	".SH SEE ALSO\n"
	"\\fBfusermount3\\fR(1), \\fBmount.fuse3\\fR(8), \\fBfstab\\fR(5), "
	"\\fBsystemd.mount\\fR(5); the mount guide, \\fBmount.md\\fR, in ckfs's "
	"documentation folder.\n";

static void print_man(FILE *to)
{
	fputs(man_head, to);
	man_synopsis(to);
	fputs(man_description, to);
	man_commands(to);
	man_mount_options(to);
	fputs(man_tail, to);
}

/* ---- bash completion ---- */

/* The shell words of a command: every option spelling, the options that
 * take a value, and (mount) the -o keys, valued ones ending in '='. */
static void completion_words(FILE *to, const struct cli_command *cmd)
{
	const struct cli_opt *o;

	fprintf(to, "_ckfs_opts_%s='", cmd->name);
	for (size_t i = 0; (o = nth_opt(cmd, i)); i++) {
		if (o->letter)
			fprintf(to, "-%c ", o->letter);
		if (o->name)
			fprintf(to, "--%s ", o->name);
	}
	fprintf(to, "'\n_ckfs_valued_%s='", cmd->name);
	for (size_t i = 0; (o = nth_opt(cmd, i)); i++) {
		if (o->arg && o->letter)
			fprintf(to, "-%c ", o->letter);
		if (o->arg && o->name)
			fprintf(to, "--%s ", o->name);
	}
	fputs("'\n", to);
	if (!takes_o(cmd))
		return;
	fprintf(to, "_ckfs_keys_%s='", cmd->name);
	for (size_t i = 0; (o = nth_opt(cmd, i)); i++)
		if (o->key)
			fprintf(to, "%s%s ", o->key, o->arg ? "=" : "");
	for (const char *const *w = ckfs_mount_fuse_flags; *w; w++)
		fprintf(to, "%s ", *w);
	for (const char *const *w = ckfs_mount_fuse_keys; *w; w++)
		fprintf(to, "%s= ", *w);
	fputs("'\n", to);
}

/* Values by long option and by -o key. */
static void completion_choices(FILE *to)
{
	bool seen[OPT_ID_END] = { false };

	fputs("_ckfs_choices() {\n\tcase $1 in\n", to);
	for (const struct cli_command *const *c = ckfs_commands; *c; c++)
		for (const struct cli_opt *const *p = (*c)->opts; *p; p++) {
			const struct cli_opt *o = *p;
			const struct cli_choice *w = o->choices;
			if (!w || seen[o->id])
				continue;
			seen[o->id] = true;
			fprintf(to, "\t%s%s%s%s) echo '", o->name ? "--" : "",
				o->name ? o->name : "", o->name && o->key ? "|" : "",
				o->key ? o->key : "");
			for (; w->word; w++)
				fprintf(to, "%s%s", w->word, w[1].word ? " " : "");
			fputs("' ;;\n", to);
		}
	fputs("\tesac\n}\n", to);
}

/* The completion function: it works out the word under the cursor from
 * COMP_LINE (COMP_WORDS is split at '=' and ':' too, so "-o dtype=b"
 * comes in pieces), then hands back only the part bash replaces. */
static const char completion_body[] =
	"# -o keys: complete the last key of a comma list, or its value.\n"
	"_ckfs_keys() { # CMD CURRENT\n"
	"\tlocal keys=_ckfs_keys_$1 cur=$2 head='' last k\n"
	"\t[[ $cur == *,* ]] && head=${cur%,*},\n"
	"\tlast=${cur##*,}\n"
	"\tif [[ $last == *=* ]]; then\n"
	"\t\tfor k in $(_ckfs_choices \"${last%%=*}\"); do\n"
	"\t\t\t[[ ${last%%=*}=$k == \"$last\"* ]] && echo \"$head${last%%=*}=$k\"\n"
	"\t\tdone\n"
	"\telse\n"
	"\t\tfor k in ${!keys-}; do\n"
	"\t\t\t[[ $k == \"$last\"* ]] && echo \"$head$k\"\n"
	"\t\tdone\n"
	"\tfi\n"
	"}\n"
	"\n"
	"_ckfs() {\n"
	"\tlocal line=${COMP_LINE:0:COMP_POINT} words cands=() c\n"
	"\tread -ra words <<<\"$line\"\n"
	"\t[[ -z $line || $line == *[[:space:]] ]] && words+=('')\n"
	"\tlocal n=${#words[@]}\n"
	"\tlocal cur=${words[n-1]} prev=${words[n-2]-} cmd=${words[1]-}\n"
	"\tlocal opts=_ckfs_opts_$cmd valued=_ckfs_valued_$cmd\n"
	"\tCOMPREPLY=()\n"
	"\tif ((n == 2)); then\n"
	"\t\tcands=($(compgen -W \"$_ckfs_commands --help --version\" -- \"$cur\"))\n"
	"\telif [[ $cmd == help ]]; then\n"
	"\t\t((n == 3)) && cands=($(compgen -W \"$_ckfs_commands\" -- \"$cur\"))\n"
	"\telif [[ -n $prev && \" ${!valued-} \" == *\" $prev \"* ]]; then\n"
	"\t\tif [[ $prev == -o || $prev == --options ]]; then\n"
	"\t\t\tcands=($(_ckfs_keys \"$cmd\" \"$cur\"))\n"
	"\t\t\t[[ ${cands[*]} == *= ]] && compopt -o nospace 2>/dev/null\n"
	"\t\telse\n"
	"\t\t\tc=$(_ckfs_choices \"$prev\")\n"
	"\t\t\t[[ -n $c ]] || return 0 # a path, a size: the shell's default\n"
	"\t\t\tcands=($(compgen -W \"$c\" -- \"$cur\"))\n"
	"\t\tfi\n"
	"\telif [[ $cur == -* ]]; then\n"
	"\t\tcands=($(compgen -W \"${!opts-}\" -- \"$cur\"))\n"
	"\telse\n"
	"\t\treturn 0 # an argument: files and folders (complete -o default)\n"
	"\tfi\n"
	"\t# bash replaces only the text after the last '=' or ':' (when they\n"
	"\t# are in COMP_WORDBREAKS, as by default): hand back that part.\n"
	"\tlocal word=$cur\n"
	"\t[[ ${COMP_WORDBREAKS-=:} == *=* ]] && word=${word##*=}\n"
	"\t[[ ${COMP_WORDBREAKS-=:} == *:* ]] && word=${word##*:}\n"
	"\tlocal cut=$((${#cur} - ${#word}))\n"
	"\tfor c in \"${cands[@]}\"; do\n"
	"\t\tCOMPREPLY+=(\"${c:cut}\")\n"
	"\tdone\n"
	"}\n"
	"complete -o default -F _ckfs ckfs\n";

static void print_completion(FILE *to)
{
	fputs("# bash completion for ckfs(1): commands, options and mount -o keys.\n"
	      "# Made by 'ckfs help --bash-completion' from the option tables that\n"
	      "# make 'ckfs --help' and the manual page; do not edit.\n"
	      "_ckfs_commands='",
	      to);
	for (const struct cli_command *const *c = ckfs_commands; *c; c++)
		fprintf(to, "%s ", (*c)->name);
	fputs("help'\n", to);
	for (const struct cli_command *const *c = ckfs_commands; *c; c++)
		completion_words(to, *c);
	completion_choices(to);
	fputs(completion_body, to);
}

/* ---- option names as JSON ---- */

/* {"<command>": {"options": {"<long option>": <takes a value>, ...},
 * and for the mount "keys": {"<-o key>": <takes a value>, ...}}}: the
 * table's long options (not --help) and -o keys, and the libfuse keys
 * the mount passes on. */
static cJSON *options_json(void)
{
	cJSON *all = cJSON_CreateObject();

	for (const struct cli_command *const *c = ckfs_commands; all && *c; c++) {
		cJSON *cmd = cJSON_AddObjectToObject(all, (*c)->name);
		cJSON *opts = cmd ? cJSON_AddObjectToObject(cmd, "options") : NULL;
		cJSON *keys = opts && takes_o(*c) ? cJSON_AddObjectToObject(cmd, "keys") : opts;
		if (!keys)
			goto fail;
		for (const struct cli_opt *const *o = (*c)->opts; *o; o++)
			if (((*o)->name && !cJSON_AddBoolToObject(opts, (*o)->name, (*o)->arg != NULL)) ||
			    (keys != opts && (*o)->key &&
			     !cJSON_AddBoolToObject(keys, (*o)->key, (*o)->arg != NULL)))
				goto fail;
		for (const char *const *w = ckfs_mount_fuse_flags; keys != opts && *w; w++)
			if (!cJSON_AddFalseToObject(keys, *w))
				goto fail;
		for (const char *const *w = ckfs_mount_fuse_keys; keys != opts && *w; w++)
			if (!cJSON_AddTrueToObject(keys, *w))
				goto fail;
	}
	return all;
fail:
	cJSON_Delete(all);
	return NULL;
}

static int print_options_json(FILE *to)
{
	cJSON *j = options_json();
	char *text = j ? cJSON_Print(j) : NULL;

	cJSON_Delete(j);
	if (!text) {
		ckfs_cli_say("out of memory");
		return 1;
	}
	fprintf(to, "%s\n", text);
	cJSON_free(text);
	return fflush(to) == 0 ? 0 : 1;
}

int ckfs_cmd_help(int argc, char **argv)
{
	if (argc != 2) {
		ckfs_cli_say("help: expected one COMMAND");
		return 2;
	}
	if (strcmp(argv[1], "--man") == 0) {
		print_man(stdout);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	if (strcmp(argv[1], "--options-json") == 0)
		return print_options_json(stdout);
	if (strcmp(argv[1], "--bash-completion") == 0) {
		print_completion(stdout);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	for (const struct cli_command *const *c = ckfs_commands; *c; c++)
		if (strcmp(argv[1], (*c)->name) == 0) {
			cli_help(*c, stdout);
			return 0;
		}
	ckfs_cli_say("help: unknown command '%s'", argv[1]);
	return 2;
}
