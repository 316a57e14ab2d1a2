/* Log lines: UTC ISO 8601 stamps with milliseconds, level, component and
 * identity, one line per event, as text or as JSON a shipper parses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "proto/log.h"

/* 2026-11-30T19:29:20.123Z */
#define WALL 1796066960123ull

static void test_text_line(void **state)
{
	char buf[512];

	proto_log_setup("tessera-node", PROTO_LOG_INFO);
	proto_log_set_format(PROTO_LOG_TEXT);
	proto_log_set_identity("r0/3");
	proto_log_format_line(buf, sizeof(buf), WALL, PROTO_LOG_WARN, "node/agent.c", 552, "hello");
	assert_string_equal(buf, "2026-11-30T19:29:20.123Z warn tessera-node[r0/3] agent.c:552: hello\n");
	proto_log_set_identity(NULL);
	proto_log_format_line(buf, sizeof(buf), WALL + 5, PROTO_LOG_ERR, "x.c", 1, "m");
	assert_string_equal(buf, "2026-11-30T19:29:20.128Z error tessera-node x.c:1: m\n");
}

static void test_json_line(void **state)
{
	char buf[512];
	json_error_t je;

	proto_log_setup("tracker", PROTO_LOG_INFO);
	proto_log_set_format(PROTO_LOG_JSON);
	proto_log_set_identity("127.0.0.1:7070");
	proto_log_format_line(buf, sizeof(buf), WALL, PROTO_LOG_INFO, "tracker/http.c", 9,
			      "a \"quoted\" word");
	assert_ptr_equal(strchr(buf, '\n'), buf + strlen(buf) - 1); /* one line */
	json_t *o = json_loads(buf, 0, &je);
	assert_non_null(o);
	assert_string_equal(json_string_value(json_object_get(o, "ts")), "2026-11-30T19:29:20.123Z");
	assert_string_equal(json_string_value(json_object_get(o, "level")), "info");
	assert_string_equal(json_string_value(json_object_get(o, "component")), "tracker");
	assert_string_equal(json_string_value(json_object_get(o, "id")), "127.0.0.1:7070");
	assert_string_equal(json_string_value(json_object_get(o, "src")), "http.c:9");
	assert_string_equal(json_string_value(json_object_get(o, "msg")), "a \"quoted\" word");
	json_decref(o);
	/* Bytes that are not UTF-8 still make one parseable line. */
	proto_log_format_line(buf, sizeof(buf), WALL, PROTO_LOG_INFO, "a.c", 1, "bad \xff byte");
	o = json_loads(buf, 0, &je);
	assert_non_null(o);
	json_decref(o);
	proto_log_set_format(PROTO_LOG_TEXT);
	proto_log_set_identity(NULL);
}

static void test_names(void **state)
{
	int level = -1;
	enum proto_log_format f;

	assert_int_equal(proto_log_parse_level("err", &level), 0);
	assert_int_equal(level, PROTO_LOG_ERR);
	assert_int_equal(proto_log_parse_level("error", &level), 0);
	assert_int_equal(proto_log_parse_level("debug", &level), 0);
	assert_int_equal(level, PROTO_LOG_DEBUG);
	assert_int_equal(proto_log_parse_level("note", &level), 0);
	assert_int_equal(level, PROTO_LOG_NOTE);
	assert_int_equal(proto_log_parse_level("notice", &level), 0);
	assert_int_equal(level, PROTO_LOG_NOTE);
	assert_string_equal(proto_log_level_name(PROTO_LOG_NOTE), "note");
	assert_string_equal(proto_log_level_name(99), "debug");
	assert_true(proto_log_parse_level("loud", &level) < 0);
	assert_true(proto_log_parse_level(NULL, &level) < 0);
	assert_int_equal(proto_log_parse_format("json", &f), 0);
	assert_int_equal(f, PROTO_LOG_JSON);
	assert_true(proto_log_parse_format("xml", &f) < 0);
}

/* A message with newlines stays one line (a peer's string cannot forge a
 * second log line). Checked on the real stderr path through a pipe. */
static void test_one_line_per_event(void **state)
{
	int fds[2], saved;
	char buf[4096];
	ssize_t n;

	assert_int_equal(pipe(fds), 0);
	fflush(stderr);
	saved = dup(2);
	assert_true(saved >= 0);
	assert_true(dup2(fds[1], 2) >= 0);
	unsetenv("TESSERA_LOG");
	proto_log_setup("t", -1); /* the default level: note */
	LOG_WARN("first\nforged 2026-11-30T00:00:00.000Z error line");
	LOG_NOTE("a note");
	LOG_INFO("below the threshold");
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	close(fds[1]);
	n = read(fds[0], buf, sizeof(buf) - 1);
	close(fds[0]);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_non_null(strstr(buf, "first forged"));
	char *note = strstr(buf, " note t ");
	assert_non_null(note);
	assert_non_null(strstr(note, "a note\n"));
	/* Two lines: the warning whole on the first, the note on the second. */
	assert_ptr_equal(strchr(buf, '\n') + 1 + strlen("2026-11-30T19:29:20.123Z"), note);
	assert_ptr_equal(strchr(note, '\n'), buf + n - 1);
	assert_null(strstr(buf, "below"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text_line),
		cmocka_unit_test(test_json_line),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_one_line_per_event),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
