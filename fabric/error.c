/* The fabric error boundary: libfabric's -FI_E* codes become negative errno. */
#include <errno.h>

#include "fabric/fab_internal.h"
#include "proto/log.h"

int fab__errno(int fi_err)
{
	int e = fi_err < 0 ? -fi_err : fi_err;

	if (e == 0)
		return 0;
	if (e < FI_ERRNO_OFFSET)
		return e; /* FI_E* below the offset are errno values */
	switch (e) {
	case FI_ETOOSMALL:
		return ENOBUFS;
	case FI_EOPBADSTATE:
		return EBADFD;
	case FI_EAVAIL:
		return EAGAIN;
	case FI_EBADFLAGS:
		return EINVAL;
	case FI_ENOEQ:
	case FI_ENOCQ:
	case FI_ENOAV:
	case FI_EDOMAIN:
		return EBADFD;
	case FI_ECRC:
		return EBADMSG;
	case FI_ETRUNC:
		return EMSGSIZE;
	case FI_ENOKEY:
		return ENOKEY;
	case FI_EOVERRUN:
		return EOVERFLOW;
	case FI_ENORX:
		return ENOBUFS;
	default:
		return EIO;
	}
}

int fab__fi_err(ssize_t ret, const char *call, const char *file, int line)
{
	int fi = ret < 0 ? (int)-ret : (int)ret;

	proto_log(PROTO_LOG_ERR, file, line, "%s: %s (%d)", call,
		  fi_strerror(fi), -fi);
	return -fab__errno(fi);
}
