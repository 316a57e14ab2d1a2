// Checks a Containerfile without a container engine: dockerfile-utils'
// linter (the one editors use: instructions, arguments, flags), every COPY
// source present in the build context, and every Debian package that an
// `apt-get install` line names known to apt.
//
//   node check-containerfile.mjs CONTEXT FILE     exit 0 when clean, else 1
import { readFileSync, existsSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { validate } from "dockerfile-utils";

const [context, file] = process.argv.slice(2);
if (!context || !file) {
	console.error("usage: node check-containerfile.mjs CONTEXT FILE");
	process.exit(2);
}
const text = readFileSync(file, "utf8");
const problems = [];
for (const d of validate(text, {})) {
	// severity 1: error, 2: warning; both count.
	problems.push(`${file}:${d.range.start.line + 1}: ${d.message}`);
}
// Instructions with their continuation lines joined.
const lines = text.split("\n");
const instrs = [];
for (let i = 0; i < lines.length; i++) {
	if (/^\s*(#|$)/.test(lines[i])) continue;
	let s = lines[i], start = i;
	while (s.endsWith("\\") && i + 1 < lines.length) s = s.slice(0, -1) + " " + lines[++i];
	instrs.push({ line: start + 1, text: s.trim() });
}
for (const { line, text: s } of instrs) {
	const m = s.match(/^COPY\s+(.*)$/i);
	if (m && !/--from=/.test(m[1])) {
		const args = m[1].split(/\s+/).filter((a) => !a.startsWith("--"));
		for (const src of args.slice(0, -1))
			if (!existsSync(join(context, src))) problems.push(`${file}:${line}: COPY source ${src} is not in the build context`);
	}
	const apt = s.match(/apt-get install ([^&;|]*)/);
	if (apt) {
		for (const pkg of apt[1].split(/\s+/).filter((p) => p && !p.startsWith("-"))) {
			try {
				execFileSync("apt-cache", ["show", "--no-all-versions", pkg], { stdio: "ignore" });
			} catch {
				problems.push(`${file}:${line}: apt does not know package ${pkg}`);
			}
		}
	}
}
for (const p of problems) console.error(p);
console.log(`check-containerfile: ${instrs.length} instructions, ${problems.length} problems`);
process.exit(problems.length === 0 ? 0 : 1);
