// Package sdnotify sends systemd service notifications (sd_notify(3)): READY=1 once the
// daemon serves, STOPPING=1 on shutdown, STATUS= lines for `systemctl status`.
package sdnotify

import (
	"net"
	"os"
)

// Notify sends state to the socket named by $NOTIFY_SOCKET. Without that variable (not run by
// systemd with Type=notify) it does nothing.
func Notify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // abstract socket
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}
