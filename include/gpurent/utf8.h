/* utf8.h: strict UTF-8 (no overlong forms, no surrogates, nothing past
 * U+10FFFF): checking a request's bytes, and making text that quotes them
 * safe to put in a JSON reply. */
#ifndef GPURENT_UTF8_H
#define GPURENT_UTF8_H

#include <stddef.h>

/* Length of the valid UTF-8 sequence that starts s (n bytes available):
 * 1 to 4, or 0 if the bytes there are not one. */
size_t utf8_sequence(const unsigned char *s, size_t n);
/* Whether the n bytes at s are valid UTF-8. */
int utf8_valid(const char *s, size_t n);
/* How many characters (code points) the n bytes of valid UTF-8 at s hold:
 * the length a person, and JSON Schema's minLength and maxLength, count. */
size_t utf8_chars(const char *s, size_t n);
/* Replaces, in place, every byte of s (NUL-terminated) that is not part of
 * a valid sequence with '?': jansson refuses strings that are not UTF-8,
 * and an error message may quote a client's bytes or cut a character in
 * two where it was truncated. */
void utf8_scrub(char *s);
/* How many of the last bytes of s (n bytes) are the start of a character
 * that n cuts short (0 to 3): text cut to at most n bytes ends that many
 * bytes earlier so as not to split a character in two (whose halves would
 * each be replaced, neither being UTF-8). */
size_t utf8_cut_tail(const unsigned char *s, size_t n);

#endif
