"""The dashboard's screens: the tabbed dashboard and the "session lost" dialog."""
