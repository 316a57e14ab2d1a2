/* bench_first_touch: what the first access to each page of a memfd slot
 * costs, by how the page got there (node/rebuild/slots.c, "The warm slot").
 *
 * Usage: bench_first_touch [MiB] (default 64). For each way a slot's pages
 * can be made, it times one byte written (or read) per 4 KiB page through
 * the mapping, and the preparation itself, in us per page, with the minor
 * faults per page the process took meanwhile. In a VM the first access from
 * user space to a page of a new mapping can trap to the hypervisor even
 * when the kernel already allocated and mapped the page (no fault counted):
 * the rows show which preparations take that cost off the later writes.
 * Not a test: it prints figures and asserts nothing.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u

static size_t len;

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static long minflt(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return r.ru_minflt;
}

static int new_fd(void)
{
	int fd = memfd_create("bench-first-touch", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
		perror("memfd");
		exit(1);
	}
	return fd;
}

static uint8_t *map(int fd, int flags)
{
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | flags, fd, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	return p;
}

static void fill_by_pwrite(int fd)
{
	static uint8_t buf[1 << 20];
	memset(buf, 7, sizeof(buf));
	for (size_t off = 0; off < len; off += sizeof(buf))
		if (pwrite(fd, buf, (len - off < sizeof(buf) ? len - off : sizeof(buf)), (off_t)off) < 0) {
			perror("pwrite");
			exit(1);
		}
}

enum op { WRITE, READ, POP_WRITE, MEMSET };

/* Times op over every page of p and prints one row. */
static void row(const char *what, enum op op, uint8_t *p)
{
	size_t pages = len / PAGE;
	long f0 = minflt();
	uint64_t t0 = now_ns();
	volatile uint8_t sink = 0;

	if (op == POP_WRITE)
		(void)madvise(p, len, MADV_POPULATE_WRITE);
	else if (op == MEMSET)
		memset(p, 1, len);
	else
		for (size_t off = 0; off < len; off += PAGE) {
			if (op == WRITE)
				p[off + 100] ^= 1;
			else
				sink += p[off];
		}
	(void)sink;
	uint64_t t1 = now_ns();
	printf("  %-62s %8.2f us/page %5.2f faults/page\n", what, (double)(t1 - t0) / 1e3 / (double)pages,
	       (double)(minflt() - f0) / (double)pages);
}

static void done(int fd, uint8_t *p)
{
	munmap(p, len);
	close(fd);
}

/* One way to make a slot's pages, and what is timed on them in turn. */
struct way {
	const char *title;
	bool filled; /* by pwrite before the mapping */
	int flags;   /* mmap's */
	struct {
		enum op op;
		const char *what;
	} steps[3];
};

static const struct way ways[] = {
	{"a new memfd, a new mapping", false, 0,
	 {{WRITE, "first write (fault: allocate, clear, map)"}, {WRITE, "second write"}}},
	{"a new memfd mapped with MAP_POPULATE", false, MAP_POPULATE, {{WRITE, "first write"}}},
	{"a new memfd, MADV_POPULATE_WRITE on the mapping", false, 0,
	 {{POP_WRITE, "MADV_POPULATE_WRITE"}, {WRITE, "then first write"}}},
	{"a new memfd, MADV_POPULATE_WRITE, a read of each page (the warm slot)", false, 0,
	 {{POP_WRITE, "MADV_POPULATE_WRITE"}, {READ, "then a read of each page"},
	  {WRITE, "then first write"}}},
	{"pages filled by pwrite, then a new mapping", true, 0, {{WRITE, "first write"}}},
	{"pages filled by pwrite, a new mapping, a read of each page first", true, 0,
	 {{READ, "read"}, {WRITE, "then first write"}}},
	{"pages written through one mapping (a slot the copy wrote)", false, 0,
	 {{MEMSET, "memset through the mapping"}, {WRITE, "then a write through the same mapping"}}},
};

int main(int argc, char **argv)
{
	len = (size_t)(argc > 1 ? atoi(argv[1]) : 64) << 20;
	if (len == 0) {
		fprintf(stderr, "usage: bench_first_touch [MiB]\n");
		return 2;
	}
	printf("bench_first_touch: %zu MiB, %zu pages each\n", len >> 20, len / PAGE);
	for (size_t i = 0; i < sizeof(ways) / sizeof(ways[0]); i++) {
		const struct way *w = &ways[i];
		int fd = new_fd();
		printf("%s:\n", w->title);
		if (w->filled)
			fill_by_pwrite(fd);
		uint8_t *p = map(fd, w->flags);
		for (size_t k = 0; k < 3 && w->steps[k].what != NULL; k++)
			row(w->steps[k].what, w->steps[k].op, p);
		if (i + 1 == sizeof(ways) / sizeof(ways[0])) {
			uint8_t *q = map(fd, 0);
			row("then a first write through another mapping of the memfd", WRITE, q);
			munmap(q, len);
		}
		done(fd, p);
	}
	return 0;
}
